"""OpenAI wire formats: requests as the API accepts them, responses and stream chunks as it sends them."""
from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common import keep_alive
from common.errors import ErrorBody, OvqError

UINT32_MAX = 4_294_967_295


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, the usage so far on every chunk


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role not in ("assistant", "function"):
            raise ValueError(f"content is required for a {self.role} message")
        return self

    def text(self) -> str | None:
        """Text parts joined; other part types are for servables that take them (vision), not text models."""
        if not isinstance(self.content, list):
            return self.content
        for part in self.content:
            if part.type != "text":
                raise OvqError(f"content part type {part.type!r} is not supported by this model", param="messages")
        return "".join(part.text or "" for part in self.content)

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        urls = []
        for part in self.content:
            if part.type == "image_url":
                if part.image_url is None:
                    raise OvqError("an image_url part needs image_url.url", param="messages")
                urls.append(part.image_url.url)
            elif part.type != "text":
                raise OvqError(f"content part type {part.type!r} is not supported", param="messages")
        return urls

    def template_content(self) -> str | list[dict[str, Any]] | None:
        """Content as vision chat templates expect it: text parts, and `{"type": "image"}` where images go."""
        if not isinstance(self.content, list):
            return self.content
        return [{"type": "text", "text": p.text or ""} if p.type == "text" else {"type": "image"}
                for p in self.content]


def _check_range(name: str, value: float | None, low: float, high: float, message: str) -> None:
    if value is not None and not low <= value <= high:
        raise OvqError(f"{name} {message}", param=name)


class SamplingRequest(BaseModel):
    """Fields shared by chat and completions. Unknown fields are ignored, as OpenAI clients send extras.

    Every check that needs no model is made here, with OVMS's wording where OVMS has one.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    best_of: int | None = None
    skip_special_tokens: bool = True
    num_assistant_tokens: int | None = None
    max_ngram_size: int | None = None
    assistant_confidence_threshold: float | None = None
    # The LoRA adapter `model` named (set by the API when it resolves the name, never by the client). A plain
    # attribute, not a PrivateAttr: pydantic's private-attribute machinery cost every request ~20 µs (its init
    # hook, __getattr__/__setattr__); the serializers skip what is not a field, so it never reaches the wire.
    _adapter: ClassVar[str | None] = None
    logit_bias: dict[str, float] | None = None
    # Ollama's: how long a pool worker keeps the model loaded after this request (seconds, or "5m"; negative: for
    # good). Parsed to seconds by `_keep_alive`.
    keep_alive: float | None = None

    @property
    def adapter(self) -> str | None:
        return self._adapter

    @adapter.setter
    def adapter(self, value: str | None) -> None:
        object.__setattr__(self, "_adapter", value)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> list[str] | None:
        if value is None or isinstance(value, str):
            return None if value is None else [value]
        if not isinstance(value, list):
            raise OvqError("stop is not a string or array of strings", param="stop")
        if not all(isinstance(v, str) for v in value):
            raise OvqError("stop array contains non string element", param="stop")
        if len(value) > 16:
            raise OvqError("stop array must have no more than 16 strings", param="stop")
        return value

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _keep_alive(cls, value: Any) -> float | None:
        if value is None:
            return None
        if not isinstance(value, int | float | str):
            raise OvqError("keep_alive must be a number of seconds or a duration such as \"5m\"", param="keep_alive")
        try:
            return keep_alive.parse(value)
        except ValueError as exc:
            raise OvqError(str(exc), param="keep_alive") from None

    @model_validator(mode="after")
    def _checks(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise OvqError("stream_options provided, but stream not set to true", param="stream_options")
        _check_range("temperature", self.temperature, 0.0, 2.0, "out of range(0.0, 2.0)")
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "out of range(-2.0, 2.0)")
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0, "out of range(-2.0, 2.0)")
        _check_range("seed", self.seed, 0, UINT32_MAX, f"out of range [0, {UINT32_MAX}]")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise OvqError("top_p out of range(0.0, 1.0]", param="top_p")
        if self.min_p is not None and not 0.0 <= self.min_p < 1.0:
            raise OvqError("min_p out of range [0.0, 1.0)", param="min_p")
        if self.top_k is not None and (self.top_k < -1 or self.top_k == 0):
            raise OvqError("top_k must be -1 (all tokens) or a positive integer", param="top_k")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise OvqError("repetition_penalty must be greater than 0", param="repetition_penalty")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise OvqError("max_tokens is not an unsigned integer", param="max_tokens")
        if self.min_tokens is not None and self.min_tokens < 0:
            raise OvqError("min_tokens is not an unsigned integer", param="min_tokens")
        self._check_choices()
        for name in ("num_assistant_tokens", "max_ngram_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise OvqError(f"{name} must be greater than 0", param=name)
        _check_assistant(self.num_assistant_tokens, self.assistant_confidence_threshold)
        if self.logit_bias:
            raise OvqError("logit_bias is not supported: GenAI has no per-token bias", param="logit_bias")
        return self

    def _check_choices(self) -> None:
        if self.n < 1:
            raise OvqError("n value should be greater than 0", param="n")
        if self.best_of is not None:
            if self.best_of < 1:
                raise OvqError("best_of value should be greater than 0", param="best_of")
            if self.n > self.best_of:
                raise OvqError("n value cannot be greater than best_of", param="n")
        if (self.best_of or 1) == 1 and self.length_penalty is not None:
            raise OvqError("length_penalty applies to beam search only: set best_of > 1", param="length_penalty")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def top_logprobs_asked(self) -> int | None:
        """None without log-probabilities, else how many alternatives per token (each endpoint says)."""
        return None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = "function"
    function: FunctionDefinition

    @field_validator("type")
    @classmethod
    def _function_only(cls, value: str) -> str:
        if value != "function":
            raise OvqError("Only function tools are supported", param="tools")
        return value


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.json_schema is None):
            raise OvqError("response_format of type json_schema needs json_schema.schema", param="response_format")
        return self


UNSUPPORTED_CHAT = {
    "functions": "functions are deprecated by OpenAI and not supported: use tools",
    "function_call": "function_call is deprecated by OpenAI and not supported: use tool_choice",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_form(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("none", "auto", "required"):
            raise OvqError("tool_choice should be either 'none' or 'auto' or 'required'", param="tool_choice")
        if value is not None and not isinstance(value, (str, dict)):
            raise OvqError("tool_choice is not a valid JSON object or string", param="tool_choice")
        return value

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        for name, message in UNSUPPORTED_CHAT.items():
            if (self.model_extra or {}).get(name) is not None:
                raise OvqError(message, param=name)
        if self.max_completion_tokens is not None:
            if self.max_completion_tokens < 0:
                raise OvqError("max_completion_tokens is not an unsigned integer", param="max_completion_tokens")
            self.max_tokens = self.max_completion_tokens
        if self.max_tokens == 0:
            raise OvqError("max_tokens value should be greater than 0", param="max_tokens")
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise OvqError("top_logprobs requires logprobs to be true", param="top_logprobs")
            _check_top(self.top_logprobs, "top_logprobs", 20)
        self._check_tools()
        return self

    def _check_tools(self) -> None:
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise OvqError("tool_choice is only allowed when tools are specified", param="tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools or []}:
                raise OvqError(f"tool_choice names function '{name}', which is not in tools", param="tool_choice")

    @property
    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def _check_top(value: int, name: str, limit: int) -> None:
    if not 0 <= value <= limit:
        raise OvqError(f"{name} out of range [0, {limit}]", param=name)
    if value > 1:
        raise OvqError(f"{name} above 1 is not supported: OpenVINO GenAI reports only the chosen token's "
                       "log-probability (1 works with greedy decoding, where it is the most likely one)", param=name)


MAX_PROMPTS = 128


class CompletionRequest(SamplingRequest):
    # A string, token ids, or a list of either (several prompts: one job each, choices indexed prompt * n + i).
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts_given(cls, value: str | list[str] | list[int] | list[list[int]]) -> Any:
        if not value or (isinstance(value, list) and any(isinstance(p, (str, list)) and not p for p in value)):
            raise ValueError("prompt must not be empty")
        if isinstance(value, list) and isinstance(value[0], (str, list)) and len(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per job: a list of strings or of token-id lists is several prompts."""
        value = self.prompt
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            return list(value)
        return [value]

    @model_validator(mode="after")
    def _completion_checks(self) -> CompletionRequest:
        if self.suffix:
            raise OvqError("suffix is not supported: no served model does fill-in-the-middle", param="suffix")
        if self.max_tokens == 0 and not self.echo:
            raise OvqError("max_tokens value should be greater than 0 unless echo is set", param="max_tokens")
        if self.logprobs is not None:
            _check_top(self.logprobs, "logprobs", 5)
        return self

    @property
    def top_logprobs_asked(self) -> int | None:
        return self.logprobs


# ---- responses ------------------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = []


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    service_tier: Literal["default", "flex", "priority"] | None = None  # the tier it was served at
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    service_tier: Literal["default", "flex", "priority"] | None = None  # the tier it was served at
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ovq"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


# ---- images -------------------------------------------------------------------------------------------------


class ImageRequest(BaseModel):
    """Fields of /images/generations and /images/edits; OVMS's extensions included. Anything else is a 400."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str = Field(min_length=1)
    n: int = Field(default=1, ge=1)
    size: str | None = None
    response_format: Literal["b64_json"] | None = None
    output_format: Literal["png"] | None = None
    quality: Literal["auto"] | None = None
    background: Literal["auto", "opaque"] | None = None
    stream: bool = False
    partial_images: int | None = Field(default=None, ge=0)
    user: str | None = None
    num_inference_steps: int | None = Field(default=None, ge=1)
    guidance_scale: float | None = Field(default=None, ge=0.0)
    negative_prompt: str | None = None
    prompt_2: str | None = None
    prompt_3: str | None = None
    negative_prompt_2: str | None = None
    negative_prompt_3: str | None = None
    max_sequence_length: int | None = Field(default=None, ge=1)
    rng_seed: int | None = Field(default=None, ge=0)
    # ovq: the served LoRA adapters' weights for this image, by name (an edit's form field holds it as JSON text)
    lora_weights: dict[str, float] | None = None

    @field_validator("lora_weights", mode="before")
    @classmethod
    def _weights_from_form(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError("must be a JSON object of adapter names and weights") from exc
        return value


class ImageEditRequest(ImageRequest):
    strength: float | None = Field(default=None, ge=0.0, le=1.0)


class ImageData(BaseModel):
    b64_json: str


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    size: str | None = None
    output_format: Literal["png"] = "png"


class StreamError(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorBody


class ImageStreamEvent(BaseModel):
    """OpenAI's image streaming events (`*.partial_image` per denoising step, `*.completed` per image)."""

    type: str
    b64_json: str
    created_at: int
    size: str
    quality: Literal["auto"] = "auto"
    background: Literal["opaque"] = "opaque"
    output_format: Literal["png"] = "png"
    partial_image_index: int | None = None
    # ovq: which denoising step this progress is, of how many, and for which image of the request.
    step: int | None = None
    total_steps: int | None = None
    index: int | None = None
    usage: dict[str, Any] | None = None


def _check_assistant(tokens: int | None, threshold: float | None) -> None:
    """Speculative decoding drafts either a fixed number of tokens or while the draft is this sure, not both."""
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise OvqError("assistant_confidence_threshold out of range (0.0, 1.0]", param="assistant_confidence_threshold")
    if tokens is not None and threshold is not None:
        raise OvqError("num_assistant_tokens and assistant_confidence_threshold are mutually exclusive",
                       param="assistant_confidence_threshold")
