"""OpenAI Responses wire formats: `POST /responses` as the API accepts it, the `Response` object and stream events.

Shapes follow OpenAI's API reference and the `openai` SDK's `openai.types.responses` (tests parse every object
ovq sends with the SDK's own types). What ovq cannot do is refused with a 400 that says so: built-in tools,
reusable prompts, item references, images by file id.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from api.queue.priority import SERVICE_TIERS
from common.errors import OvqError

MAX_METADATA = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MIN_OUTPUT_TOKENS = 16  # OpenAI refuses fewer: "Expected a value >= 16"
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
BUILTIN_TOOLS = ("web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
                 "file_search", "computer_use", "computer_use_preview", "code_interpreter", "mcp",
                 "image_generation", "local_shell", "shell", "apply_patch", "custom", "tool_search")
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs")
LOGPROBS = "message.output_text.logprobs"
Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _values(values: tuple[str, ...] | list[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + f" and {quoted[-1]}" if len(quoted) > 1 else quoted[0]


def invalid_value(param: str, value: Any, supported: tuple[str, ...] | list[str]) -> OvqError:
    return OvqError(f"Invalid value: '{value}'. Supported values are: {_values(supported)}.", param=param,
                    code="invalid_value")


def missing(param: str) -> OvqError:
    return OvqError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def not_supported(param: str, what: str) -> OvqError:
    return OvqError(f"{what} is not supported by ovq", param=param, code="unsupported_parameter")


def pydantic_error(exc: ValidationError, where: str) -> OvqError:
    """The first problem pydantic found inside `where` (an item, a tool), as a 400 naming the nested field."""
    first = exc.errors()[0]
    path = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]
                           if not str(p).startswith("function-"))
    if first["type"] == "missing":
        return missing(path)
    return OvqError(f"Invalid '{path}': {first['msg']}", param=path, code="invalid_value")


def check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's limits on `metadata` (a response's, a conversation's): 16 pairs, keys of 64 characters at most,
    values of 512 (`object_above_max_size`, `string_above_max_length`)."""
    if value is None:
        return None
    if len(value) > MAX_METADATA:
        raise OvqError(f"Invalid 'metadata': too many properties. Expected an object with at most {MAX_METADATA}"
                       f" properties, but got an object with {len(value)} properties instead.",
                       param="metadata", code="object_above_max_size")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise OvqError(f"Invalid 'metadata': key '{key[:16]}…' is longer than {MAX_METADATA_KEY} "
                           "characters.", param="metadata", code="string_above_max_length")
        if len(item) > MAX_METADATA_VALUE:
            raise OvqError(f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                           f"{MAX_METADATA_VALUE}, but got a string with length {len(item)} instead.",
                           param=f"metadata.{key}", code="string_above_max_length")
    return value


def _parse(adapter: TypeAdapter[Any], value: Any, where: str) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise pydantic_error(exc, where) from None


# ---- input items ------------------------------------------------------------------------------------------


class InputText(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class InputImage(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["input_image"] = "input_image"
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto", "original"] = "auto"


class Logprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[dict[str, Any]] = []


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = []
    logprobs: list[Logprob] = []  # empty unless asked for (`include`): the spec takes an array, never null

    @field_validator("logprobs", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        return [] if value is None else value  # as a client may send history back, and ovq once stored it


class Refusal(BaseModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class SummaryText(BaseModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


Part = Annotated[InputText | InputImage | OutputText | Refusal, Field(discriminator="type")]
INPUT_PARTS = ("input_text", "input_image", "input_file", "input_audio")
OUTPUT_PARTS = ("output_text", "refusal")
_PART = TypeAdapter(Part)


class Message(BaseModel):
    """An input message: user, system and developer ones take input parts, assistant ones (history) output parts."""

    model_config = ConfigDict(extra="allow")

    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]
    status: ItemStatus | None = None


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputText | Refusal] = []


class FunctionCall(BaseModel):
    """A call the model made: an output item, and an input item when a client sends the history back."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"] = "function_call"
    id: str | None = None
    call_id: str
    name: str
    arguments: str
    status: ItemStatus | None = None


class FunctionCallOutput(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    call_id: str
    output: str | list[Annotated[InputText | InputImage, Field(discriminator="type")]]
    status: ItemStatus | None = None


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = Field(None, exclude_if=lambda v: v is None)  # the spec takes no null
    status: ItemStatus | None = None


class Compaction(BaseModel):
    """What `/responses/compact` puts in place of a conversation's earlier turns (compact.py). OpenAI's
    `encrypted_content` is opaque; ovq's is the model's summary as plain text (it keeps no secret from the client
    that sent the conversation)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["compaction"] = "compaction"
    id: str | None = None
    encrypted_content: str
    created_by: str | None = None
    status: ItemStatus | None = None


Item = Message | FunctionCall | FunctionCallOutput | Reasoning | Compaction
OutputItem = OutputMessage | FunctionCall | Reasoning
ITEMS: dict[str, TypeAdapter[Any]] = {
    "message": TypeAdapter(Message), "function_call": TypeAdapter(FunctionCall),
    "function_call_output": TypeAdapter(FunctionCallOutput), "reasoning": TypeAdapter(Reasoning),
    "compaction": TypeAdapter(Compaction)}


def parse_item(value: Any, where: str = "input") -> Item:
    """One input item (or a stored one of a previous response), with OpenAI's checks and a 400 naming it."""
    if isinstance(value, (Message, FunctionCall, FunctionCallOutput, Reasoning, Compaction)):
        return value
    if not isinstance(value, dict):
        raise OvqError(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
    kind = value.get("type", "message" if "role" in value else None)
    if kind is None:
        raise missing(f"{where}.type")
    if kind == "item_reference":
        raise not_supported(where, "item_reference input items (use previous_response_id)")
    if kind not in ITEMS:
        if not isinstance(kind, str):
            raise invalid_value(f"{where}.type", kind, list(ITEMS))
        raise not_supported(f"{where}.type", f"input item type '{kind}'")
    if kind == "message":
        _check_parts(value, where)
    return _parse(ITEMS[kind], {**value, "type": kind}, where)


def _check_parts(value: dict[str, Any], where: str) -> None:
    """Which parts a role takes, as OpenAI words it: input parts for the user's side, output ones for history."""
    content = value.get("content")
    if not isinstance(content, list):
        return
    allowed = OUTPUT_PARTS if value.get("role") == "assistant" else INPUT_PARTS
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        param = f"{where}.content[{i}]"
        if kind not in allowed:
            raise invalid_value(f"{param}.type", kind, allowed)
        if kind in ("input_file", "input_audio"):
            raise not_supported(param, f"{kind} content")
        if kind == "input_image":
            _check_image(part, param)


def _check_image(part: dict[str, Any], param: str) -> None:
    if part.get("file_id") is not None:
        raise not_supported(f"{param}.file_id", "an input_image by file_id (send a base64 data URL in image_url)")
    if not part.get("image_url"):
        raise missing(f"{param}.image_url")


# ---- request ------------------------------------------------------------------------------------------------


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


_TOOL = TypeAdapter(FunctionTool)


class ToolChoiceFunction(BaseModel):
    type: Literal["function"] = "function"
    name: str


class AllowedTools(BaseModel):
    """`allowed_tools`: calls limited to these (function) tools; `mode` is `auto` or `required`."""

    type: Literal["allowed_tools"] = "allowed_tools"
    mode: Literal["auto", "required"]
    tools: list[ToolChoiceFunction]


ToolChoice = Literal["none", "auto", "required"] | ToolChoiceFunction | AllowedTools
_CHOICES: dict[str, TypeAdapter[Any]] = {"function": TypeAdapter(ToolChoiceFunction),
                                         "allowed_tools": TypeAdapter(AllowedTools)}


class TextFormatText(BaseModel):
    type: Literal["text"] = "text"


class TextFormatJSONObject(BaseModel):
    type: Literal["json_object"] = "json_object"


class TextFormatJSONSchema(BaseModel):
    model_config = ConfigDict(populate_by_name=True)  # dumped by alias: `schema` on the wire

    type: Literal["json_schema"] = "json_schema"
    name: str
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool = False  # OpenAI's default; the spec takes no null

    @field_validator("strict", mode="before")
    @classmethod
    def _strict(cls, value: Any) -> Any:
        return False if value is None else value


TextFormat = Annotated[TextFormatText | TextFormatJSONObject | TextFormatJSONSchema, Field(discriminator="type")]


class TextConfig(BaseModel):
    format: TextFormat = TextFormatText()
    verbosity: Literal["low", "medium", "high"] = "medium"  # OpenAI's default; the spec takes no null

    @field_validator("verbosity", mode="before")
    @classmethod
    def _default(cls, value: Any) -> Any:
        return "medium" if value is None else value


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ConversationRef(BaseModel):
    """`conversation` as an object (a request may send the id alone), and as a response echoes it."""

    id: str


class StreamOptions(BaseModel):
    include_obfuscation: bool | None = None


UNSUPPORTED = {
    "prompt": "prompt (reusable prompt templates)",
    "context_management": "context_management",
}
# ovq's sampling extensions, as chat takes them: passed on to the chat request unchanged.
EXTENSIONS = ("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
              "chat_template_kwargs", "ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output",
              "logit_bias")


class ResponsesRequest(BaseModel):
    """`POST /responses`. Unknown fields are ignored, as chat ignores them; OpenAI's limits are checked here."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[Item] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    text: TextConfig = TextConfig()
    tools: list[FunctionTool] = []
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    store: bool = True
    previous_response_id: str | None = None
    background: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    truncation: Literal["disabled", "auto"] = "disabled"
    include: list[str] = []
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None  # api/queue/priority.py reads it
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    conversation: str | ConversationRef | None = None  # api/openai/conversations/: its items are the history

    @field_validator("service_tier", mode="before")
    @classmethod
    def _tier(cls, value: Any) -> Any:
        if value is not None and value not in SERVICE_TIERS:
            raise invalid_value("service_tier", value, SERVICE_TIERS)
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise OvqError("Invalid type for 'input': expected a string or an array of input items.",
                           param="input", code="invalid_type")
        return [parse_item(item, f"input[{i}]") for i, item in enumerate(value)]

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, value: Any) -> Any:
        if value is None:
            return []
        if not isinstance(value, list):
            raise OvqError("Invalid type for 'tools': expected an array of tools.", param="tools",
                           code="invalid_type")
        return [_tool(tool, f"tools[{i}]") for i, tool in enumerate(value)]

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None:
            return "auto"
        if isinstance(value, str):
            if value not in ("none", "auto", "required"):
                raise invalid_value("tool_choice", value, ("none", "auto", "required"))
            return value
        if not isinstance(value, dict):
            raise OvqError("Invalid type for 'tool_choice': expected a string or an object.", param="tool_choice",
                           code="invalid_type")
        kind = value.get("type")
        if kind not in _CHOICES:
            if isinstance(kind, str) and (kind in BUILTIN_TOOLS or kind.startswith("web_search")):
                raise not_supported("tool_choice.type", f"tool_choice type '{kind}'")
            raise invalid_value("tool_choice.type", kind, list(_CHOICES))
        return _parse(_CHOICES[kind], value, "tool_choice")

    @field_validator("text", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if value is None:
            return TextConfig()
        fmt = value.get("format") if isinstance(value, dict) else None
        if isinstance(fmt, dict):
            kind = fmt.get("type")
            if kind not in ("text", "json_object", "json_schema"):
                raise invalid_value("text.format.type", kind, ("text", "json_schema", "json_object"))
            if kind == "json_schema":
                for name in ("name", "schema"):
                    if fmt.get(name) is None:
                        raise missing(f"text.format.{name}")
                _check_name(fmt["name"], "text.format.name")
                if not isinstance(fmt["schema"], dict):
                    raise OvqError("Invalid type for 'text.format.schema': expected an object.",
                                   param="text.format.schema", code="invalid_type")
        return value

    @field_validator("include", mode="before")
    @classmethod
    def _include(cls, value: Any) -> Any:
        if value is None:
            return []
        if not isinstance(value, list):
            raise OvqError("Invalid type for 'include': expected an array of strings.", param="include",
                           code="invalid_type")
        for i, name in enumerate(value):
            if name not in INCLUDABLE:
                raise invalid_value(f"include[{i}]", name, INCLUDABLE)
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(value)

    @field_validator("conversation", mode="before")
    @classmethod
    def _conversation(cls, value: Any) -> Any:
        """An id, or `{"id": ...}`; OpenAI's ids (and ovq's) begin with `conv_`."""
        ref = value.get("id") if isinstance(value, dict) else value
        if value is not None and (not isinstance(ref, str) or not ref.startswith("conv_")):
            raise OvqError(f"Invalid 'conversation': '{ref}'. Expected an ID that begins with 'conv_'.",
                           param="conversation", code="invalid_value")
        return value

    @model_validator(mode="after")
    def _checks(self) -> ResponsesRequest:
        extra = self.model_extra or {}
        for name, what in UNSUPPORTED.items():
            if extra.get(name) is not None:
                raise not_supported(name, what)
        if self.conversation is not None and self.previous_response_id is not None:
            raise OvqError("Mutually exclusive parameters: Ensure you are only providing one of: "
                           "'previous_response_id' or 'conversation'.", code="mutually_exclusive_parameters")
        self._check_sampling()
        if self.stream_options is not None and not self.stream:
            raise OvqError("stream_options is only allowed when stream is true", param="stream_options")
        if self.background and not self.store:
            raise OvqError("background mode requires store to be true", param="background")
        self._check_tools()
        return self

    def _check_sampling(self) -> None:
        if self.max_output_tokens is not None and self.max_output_tokens < MIN_OUTPUT_TOKENS:
            raise OvqError(f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= "
                           f"{MIN_OUTPUT_TOKENS}, but got {self.max_output_tokens} instead.",
                           param="max_output_tokens", code="integer_below_min_value")
        if self.temperature is not None and not 0.0 <= self.temperature <= 2.0:
            raise _range("temperature", self.temperature, 0, 2)
        if self.top_p is not None and not 0.0 <= self.top_p <= 1.0:
            raise _range("top_p", self.top_p, 0, 1)
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise _range("top_logprobs", self.top_logprobs, 0, 20)
        if self.max_tool_calls is not None and self.max_tool_calls < 1:
            raise _range("max_tool_calls", self.max_tool_calls, 1, None)

    def _check_tools(self) -> None:
        names = [tool.name for tool in self.tools]
        for name in {n for n in names if names.count(n) > 1}:
            raise OvqError(f"Duplicate tool name '{name}' in tools", param="tools")
        choice = self.tool_choice
        wanted = [choice] if isinstance(choice, ToolChoiceFunction) else \
            choice.tools if isinstance(choice, AllowedTools) else []
        for function in wanted:
            if function.name not in names:
                raise OvqError(f"Tool choice '{function.name}' not found in 'tools' parameter.",
                               param="tool_choice")

    @property
    def logprobs(self) -> bool:
        return LOGPROBS in self.include

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    def items(self) -> list[Item]:
        """The input as items: a string is one user message."""
        if self.input is None:
            return []
        if isinstance(self.input, str):
            return [Message(role="user", content=self.input)]
        return list(self.input)


def _range(name: str, value: float, low: float, high: float | None) -> OvqError:
    if high is None:
        return OvqError(f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but got "
                        f"{value} instead.", param=name, code="integer_below_min_value")
    return OvqError(f"Invalid '{name}': {value} is out of range. Expected a value between {low} and {high}.",
                    param=name, code="invalid_value")


def _check_name(name: Any, param: str) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise OvqError(f"Invalid '{param}': string does not match pattern. Expected a string that matches the "
                       "pattern '^[a-zA-Z0-9_-]+$' and is at most 64 characters long.", param=param,
                       code="invalid_value")


def _tool(value: Any, where: str) -> FunctionTool:
    if not isinstance(value, dict):
        raise OvqError(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
    kind = value.get("type")
    if kind != "function":
        if isinstance(kind, str) and (kind in BUILTIN_TOOLS or kind.startswith(("web_search", "computer_use"))):
            raise not_supported(f"{where}.type", f"the built-in tool '{kind}' (ovq serves function tools)")
        raise invalid_value(f"{where}.type", kind, ("function",))
    if value.get("name") is None:
        raise missing(f"{where}.name")
    _check_name(value["name"], f"{where}.name")
    if value.get("parameters") is not None and not isinstance(value["parameters"], dict):
        raise OvqError(f"Invalid type for '{where}.parameters': expected an object.", param=f"{where}.parameters",
                       code="invalid_type")
    return _parse(_TOOL, value, where)


# ---- the response object ------------------------------------------------------------------------------------


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


# OpenAI's codes for a failed response; anything else ovq has is reported as the nearest of them.
ERROR_CODES = ("server_error", "rate_limit_exceeded", "invalid_prompt", "invalid_image", "invalid_image_format",
               "invalid_base64_image", "invalid_image_url", "image_too_large", "image_too_small",
               "image_parse_error", "unsupported_image_media_type", "empty_image_file", "failed_to_download_image")


class ResponseError(BaseModel):
    code: str
    message: str
    param: str | None = None
    type: str | None = None


# Fields the spec takes no null for, which a response stored before they were filled holds as null.
NOT_NULL = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "top_logprobs", "service_tier")


class Response(BaseModel):
    """The `response` object. `output_text` is a convenience (as in the SDKs), not a field on the wire."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Status = "in_progress"
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[Annotated[OutputItem, Field(discriminator="type")]] = []
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningConfig = ReasoningConfig()
    store: bool = True
    # The sampling used: the request's, else the model's defaults (its card's `sampling`), else OpenAI's.
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    text: TextConfig = TextConfig()
    tool_choice: ToolChoice = "auto"
    tools: list[FunctionTool] = []
    top_logprobs: int = 0
    truncation: Literal["disabled", "auto"] = "disabled"
    usage: Usage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    service_tier: str = "default"  # the tier it was served at (api/queue/priority.py)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # The conversation its input and output were added to; absent without one (the spec does not name it).
    conversation: ConversationRef | None = Field(None, exclude_if=lambda v: v is None)

    @field_validator(*NOT_NULL, mode="before")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        """A response stored before these were filled has nulls: read as the defaults."""
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @property
    def output_text(self) -> str:
        return "".join(part.text for item in self.output if isinstance(item, OutputMessage)
                       for part in item.content if isinstance(part, OutputText))


# ---- stream events ------------------------------------------------------------------------------------------
# Plain dicts, typed: a streamed answer makes one per step, and a pydantic model would cost it several times what
# building and dumping a dict does (measured: 13-21 µs against 2.4-2.8 µs per text delta, chat's own 1.6-1.8).
# Their shapes are the SDK's `ResponseStreamEvent` union (tests parse every one with it).


class _Event(TypedDict):
    type: str
    sequence_number: int


class ResponseEvent(_Event):
    """`response.created`, `.queued`, `.in_progress`, `.completed`, `.incomplete`, `.failed`."""

    response: dict[str, Any]  # a `Response`, dumped by alias


class OutputItemEvent(_Event):
    """`response.output_item.added`, `.done`."""

    output_index: int
    item: dict[str, Any]  # an output item, dumped by alias


class ContentPartEvent(_Event):
    """`response.content_part.added`, `.done`."""

    item_id: str
    output_index: int
    content_index: int
    part: dict[str, Any]  # `output_text` or `reasoning_text`


class _InPart(_Event):
    item_id: str
    output_index: int
    content_index: int


class TextDeltaEvent(_InPart):
    """`response.output_text.delta`; `logprobs` entries: token, logprob, top_logprobs."""

    delta: str
    logprobs: list[dict[str, Any]]


class TextDoneEvent(_InPart):
    text: str
    logprobs: list[dict[str, Any]]


class ReasoningDeltaEvent(_InPart):
    delta: str


class ReasoningDoneEvent(_InPart):
    text: str


class ArgumentsDeltaEvent(_Event):
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(_Event):
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(_Event):
    """`error`: a stream's trouble that is not the response's failure. OpenAI's SDK reads `code`, `message` and
    `param` beside `type`; the Open Responses spec reads them (with the error's `type`) in `error`: both are sent."""

    code: str | None
    message: str
    param: str | None
    error: dict[str, Any]


StreamEvent = (ResponseEvent | OutputItemEvent | ContentPartEvent | TextDeltaEvent | TextDoneEvent
               | ReasoningDeltaEvent | ReasoningDoneEvent | ArgumentsDeltaEvent | ArgumentsDoneEvent | ErrorEvent)
