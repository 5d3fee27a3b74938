"""A Responses request as the chat request ovq already serves: messages, tools, constraints and sampling.

The chat path then does the rest (template, guided generation, parsers, the job) exactly as for
`/chat/completions`. Items map as OpenAI documents them: `instructions` is a system message first (and only this
request's: instructions are not carried over by `previous_response_id`), a `function_call` is an assistant
message's `tool_calls` entry (consecutive calls, and calls right after the assistant's text, make one assistant
turn), a `function_call_output` a `tool` message, a `reasoning` item the next assistant turn's
`reasoning_content` (chat templates that keep reasoning read it from there), an `input_image` an `image_url` part,
a `compaction` item (compact.py) an assistant message with its summary.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from api.openai.guidance import check_schema
from api.openai.protocol import ChatCompletionRequest
from api.openai.responses.protocol import (
    EXTENSIONS,
    AllowedTools,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Item,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    Response,
    ResponsesRequest,
    TextFormatJSONObject,
    TextFormatJSONSchema,
    ToolChoiceFunction,
    missing,
    parse_item,
)
from common.errors import OvqError

FUNCTION_FIELDS = {"name", "description", "parameters", "strict"}


def to_chat(body: ResponsesRequest, history: Iterable[Item | Mapping[str, Any]] = ()) -> ChatCompletionRequest:
    """The chat request for `body`; `history` is the stored items of its `previous_response_id` chain, oldest
    first (each response's input items, then its output items), as items or as their JSON objects."""
    previous = [parse_item(dict(item) if isinstance(item, Mapping) else item, "previous_response_id")
                for item in history]
    items = previous + body.items()
    if not items:
        raise missing("input")
    messages: list[dict[str, Any]] = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += chat_messages(items)
    chat: dict[str, Any] = {
        "model": body.model, "messages": messages, "stream": body.stream,
        "max_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "parallel_tool_calls": body.parallel_tool_calls, "prompt_cache_key": body.prompt_cache_key,
        **_tools(body), **_response_format(body), **_logprobs(body), **_extensions(body)}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise OvqError(f"the request does not make a valid chat request: {field}: {first['msg']}") from None


ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
               "compaction": "cmp"}
# How a compaction item's summary reads to the model: the assistant's own note of the turns it stands for.
SUMMARY = "Summary of our conversation so far:\n"


def random_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def stored_items(body: ResponsesRequest, response: Response,
                 new_id: Callable[[str], str] = random_id) -> list[dict[str, Any]]:
    """What a response adds to its chain (and its conversation), as JSON objects to store: its input items (each
    given an id and a status, as OpenAI lists them; `new_id` makes the ids), then its output items. The next turn's
    `to_chat` takes them back as `history`, as they were sent (a message's text stays a string: the template renders
    it as it did)."""
    return identified(body.items(), new_id) + [item.model_dump(by_alias=True) for item in response.output]


def identified(items: Iterable[Item], new_id: Callable[[str], str] = random_id) -> list[dict[str, Any]]:
    """Input items as JSON objects to store: each with its id (`new_id`'s where it has none) and a status."""
    out = []
    for item in items:
        update: dict[str, Any] = {"status": item.status or "completed"}
        if item.id is None:
            update["id"] = new_id(ID_PREFIXES[item.type])
        out.append(item.model_copy(update=update).model_dump(by_alias=True, exclude_none=True))
    return out


def chat_messages(items: Iterable[Item]) -> list[dict[str, Any]]:
    """Chat messages for input items, in order; a `function_call_output` must answer a call made before it."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    reasoning: list[str] = []  # reasoning items waiting for the assistant turn they belong to
    for i, item in enumerate(items):
        if isinstance(item, Reasoning):
            reasoning.append(_reasoning_text(item))
            continue
        if isinstance(item, Compaction):
            messages.append({"role": "assistant", "content": SUMMARY + item.encrypted_content})
        elif isinstance(item, FunctionCallOutput):
            if item.call_id not in calls:
                raise OvqError(f"No tool call found for function call output with call_id {item.call_id}.",
                               param=f"input[{i}].call_id")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _tool_output(item)})
        elif isinstance(item, FunctionCall):
            calls.add(item.call_id)
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning:
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append(_message(item))
        if reasoning and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = "".join(reasoning)
        reasoning.clear()
    return messages


def _message(item: Message) -> dict[str, Any]:
    if isinstance(item.content, str):
        return {"role": item.role, "content": item.content}
    if item.role == "assistant":
        text = "".join(p.text if isinstance(p, OutputText) else p.refusal for p in item.content
                       if isinstance(p, (OutputText, Refusal)))
        return {"role": "assistant", "content": text}
    return {"role": item.role, "content": [_part(p) for p in item.content if isinstance(p, (InputText, InputImage))]}


def _part(part: InputText | InputImage) -> dict[str, Any]:
    if isinstance(part, InputText):
        return {"type": "text", "text": part.text}
    return {"type": "image_url", "image_url": {"url": part.image_url, "detail": part.detail}}


def _tool_output(item: FunctionCallOutput) -> str | list[dict[str, Any]]:
    if isinstance(item.output, str):
        return item.output
    for i, part in enumerate(item.output):
        if isinstance(part, InputImage) and not part.image_url:
            raise missing(f"output[{i}].image_url")
    return [_part(p) for p in item.output]


def _reasoning_text(item: Reasoning) -> str:
    if item.content:
        return "".join(part.text for part in item.content)
    return "\n\n".join(part.text for part in item.summary)


def _tools(body: ResponsesRequest) -> dict[str, Any]:
    """Function tools in chat's shape (`function` nested), and tool_choice; `allowed_tools` narrows the list."""
    if not body.tools:
        return {}
    choice = body.tool_choice
    tools = body.tools
    if isinstance(choice, AllowedTools):
        allowed = {t.name for t in choice.tools}
        tools = [t for t in tools if t.name in allowed]
        choice = choice.mode
    for i, tool in enumerate(body.tools):
        if tool.parameters is not None:
            check_schema(tool.parameters, f"tools[{i}].parameters")
    chat_tools = [{"type": "function", "function": tool.model_dump(include=FUNCTION_FIELDS, exclude_none=True)}
                  for tool in tools]
    if isinstance(choice, ToolChoiceFunction):
        return {"tools": chat_tools, "tool_choice": {"type": "function", "function": {"name": choice.name}}}
    return {"tools": chat_tools, "tool_choice": choice}


def _response_format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = body.text.format
    if isinstance(fmt, TextFormatJSONObject):
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, TextFormatJSONSchema):
        check_schema(fmt.json_schema, "text.format.schema")
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": fmt.name, "description": fmt.description, "schema": fmt.json_schema, "strict": fmt.strict}}}
    return {}


def _logprobs(body: ResponsesRequest) -> dict[str, Any]:
    """Log-probabilities when `include` asks for `message.output_text.logprobs` (`top_logprobs` alternatives)."""
    if not body.logprobs:
        return {}
    return {"logprobs": True, "top_logprobs": body.top_logprobs or 0}


def _extensions(body: ResponsesRequest) -> dict[str, Any]:
    """ovq's sampling extensions as chat takes them, and `reasoning.effort` for templates that read it."""
    extra = body.model_extra or {}
    out = {name: extra[name] for name in EXTENSIONS if extra.get(name) is not None}
    effort = body.reasoning.effort if body.reasoning else None
    if effort is not None:
        kwargs = out.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            return out  # chat's own check refuses it
        kwargs = dict(kwargs)
        kwargs.setdefault("reasoning_effort", effort)
        if effort == "none":
            kwargs.setdefault("enable_thinking", False)
        out["chat_template_kwargs"] = kwargs
    return out
