"""Chat templates rendered the way transformers does: jinja2, sandboxed, with its helpers."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import orjson
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from api.openai.protocol import ChatMessage
from common.errors import OvqError


class TemplateRaised(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=64)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    template = env.from_string(source)
    # A plain dict, not jinja's ChainMap of the template's and the environment's globals: every render copies them
    # into its context, and copying the ChainMap (pure Python) was three quarters of rendering a short chat.
    template.globals = dict(template.globals)
    return template


def render(source: str, messages: list[dict[str, Any]], bos_token: str, eos_token: str,
           extra: dict[str, Any] | None = None) -> str:
    """The prompt for `messages`; a template that refuses them (or breaks) is the request's 400."""
    context = {"add_generation_prompt": True, **(extra or {})}
    context.update(messages=messages, bos_token=bos_token, eos_token=eos_token)
    try:
        return _compile(source).render(**context)
    except TemplateRaised as exc:
        raise OvqError(str(exc), param="messages") from exc
    except (TemplateError, TypeError, ValueError, KeyError) as exc:
        raise OvqError(f"the chat template could not render these messages: {exc}", param="messages") from exc


def template_message(message: ChatMessage, vision: bool) -> dict[str, Any]:
    """A message as chat templates expect it: text (or vision parts), and tool-call arguments as objects."""
    out = {**message.model_dump(exclude_none=True), "content": message.template_content() if vision
           else message.text()}
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_call_for_template(c) for c in calls]
    return out


def _call_for_template(call: Any) -> Any:
    # OpenAI sends arguments as a JSON string; templates (as in transformers) index into an object.
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            arguments = orjson.loads(function["arguments"])
        except orjson.JSONDecodeError:
            return call
        return {**call, "function": {**function, "arguments": arguments}}
    return call
