"""OpenAI wire formats: requests as the API accepts them, responses and stream chunks as it sends them."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.errors import ErrorBody, OvqError

UINT32_MAX = 4_294_967_295


class StreamOptions(BaseModel):
    include_usage: bool = False


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


class SamplingRequest(BaseModel):
    """Fields shared by chat and completions. Unknown fields are ignored, as OpenAI clients send extras."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=0, le=UINT32_MAX)
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    logprobs: Any = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if isinstance(value, str):
            value = [value]
        if value is not None and len(value) > 16:
            raise ValueError("at most 16 stop sequences are supported")
        return value

    @model_validator(mode="after")
    def _supported(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise OvqError("stream_options provided, but stream not set to true", param="stream_options")
        if self.n != 1:
            raise OvqError("n > 1 is not supported yet", param="n")
        if self.best_of not in (None, 1):
            raise OvqError("best_of > 1 is not supported yet", param="best_of")
        if self.logprobs not in (None, False):
            raise OvqError("logprobs are not supported yet", param="logprobs")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        if self.tools:
            raise OvqError("tools are not supported yet", param="tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise OvqError("response_format other than text is not supported yet", param="response_format")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str] | list[int]) -> str | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], str):
            if len(value) != 1:
                raise ValueError("only one prompt per request is supported")
            value = value[0]
        if not value:
            raise ValueError("prompt must not be empty")
        return value

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if self.echo:
            raise OvqError("echo is not supported yet", param="echo")
        if self.suffix:
            raise OvqError("suffix is not supported", param="suffix")
        return self


# ---- responses ------------------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


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
