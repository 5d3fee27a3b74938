"""Size limits on what a request asks for, checked before anything is queued; the media type of a body.

Every limit is a setting (`OVQ_MAX_*`) and a 400 naming the field and the setting. They keep what reaches the
queue, the tokenizer and the engine's pipe bounded whatever a client sends: the model's own limits (context
length, max_tokens_limit) are checked later, on tokens, by the worker and `api/openai/checks.py`.
"""
from __future__ import annotations

from typing import Any

import orjson

from api.openai.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, ImageRequest, SamplingRequest
from common.errors import OvqError
from common.settings import Settings


def media_type(content_type: str | None) -> str:
    """`application/json; charset=utf-8` → `application/json`: the type and subtype, parameters dropped."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def require_media_type(content_type: str | None, expected: str, what: str) -> None:
    if media_type(content_type) != expected:
        shown = media_type(content_type)[:100] or "missing"
        raise OvqError(f"{what} takes Content-Type {expected}, not {shown!r}", 415)


def _over(param: str, size: int, limit: int, unit: str, setting: str) -> OvqError:
    return OvqError(f"{param} has {size} {unit}, over the limit of {limit} ({setting})", param=param)


def _json_size(value: Any) -> int:
    return len(orjson.dumps(value)) if value is not None else 0


def _message_chars(message: ChatMessage) -> int:
    """Characters a message adds to the prompt: its text parts, plus anything else it carries (tool calls)."""
    if isinstance(message.content, list):
        text = sum(len(part.text or "") for part in message.content if part.type == "text")
    else:
        text = len(message.content or "")
    return text + len(message.name or "") + _json_size(message.model_extra or None)


def check_chat(body: ChatCompletionRequest, settings: Settings) -> None:
    total = _json_size(body.chat_template_kwargs)
    for index, message in enumerate(body.messages):
        chars = _message_chars(message)
        if chars > settings.max_message_chars:
            raise _over(f"messages.{index}.content", chars, settings.max_message_chars, "characters",
                        "OVQ_MAX_MESSAGE_CHARS")
        total += chars
    if total > settings.max_prompt_chars:
        raise _over("messages", total, settings.max_prompt_chars, "characters in all", "OVQ_MAX_PROMPT_CHARS")
    if body.response_format and body.response_format.json_schema:
        size = _json_size(body.response_format.json_schema.json_schema)
        if size > settings.max_schema_bytes:
            raise _over("response_format", size, settings.max_schema_bytes, "bytes of schema", "OVQ_MAX_SCHEMA_BYTES")
    if body.tools:
        size = _json_size([tool.model_dump(mode="json") for tool in body.tools])
        if size > settings.max_schema_bytes:
            raise _over("tools", size, settings.max_schema_bytes, "bytes of JSON", "OVQ_MAX_SCHEMA_BYTES")


def check_completion(body: CompletionRequest, settings: Settings) -> None:
    size = len(body.prompt)  # characters, or token ids
    unit = "characters" if isinstance(body.prompt, str) else "token ids"
    if size > settings.max_prompt_chars:
        raise _over("prompt", size, settings.max_prompt_chars, unit, "OVQ_MAX_PROMPT_CHARS")
    # echo sends the prompt back token by token, each with its log-probability: one large event per request.
    if body.echo and size > settings.max_echo_prompt_chars:
        raise _over("prompt", size, settings.max_echo_prompt_chars, f"{unit} (with echo)",
                    "OVQ_MAX_ECHO_PROMPT_CHARS")


def check_sampling(body: SamplingRequest, settings: Settings) -> None:
    """The limits of a text request, whichever endpoint."""
    for stop in body.stop or []:
        if len(stop) > settings.max_stop_chars:
            raise _over("stop", len(stop), settings.max_stop_chars, "characters in one string", "OVQ_MAX_STOP_CHARS")
    if isinstance(body, ChatCompletionRequest):
        check_chat(body, settings)
    elif isinstance(body, CompletionRequest):
        check_completion(body, settings)


def check_image_prompts(body: ImageRequest, settings: Settings) -> None:
    prompts = (body.prompt, body.prompt_2, body.prompt_3, body.negative_prompt, body.negative_prompt_2,
               body.negative_prompt_3)
    size = sum(len(p or "") for p in prompts)
    if size > settings.max_prompt_chars:
        raise _over("prompt", size, settings.max_prompt_chars, "characters in all prompts", "OVQ_MAX_PROMPT_CHARS")
