"""Turning the JSON a model wrote into tool calls, or refusing to when it is not a well-formed call."""
from __future__ import annotations

from typing import Any

from .base import ToolCall
from .jsonscan import elements, load, members

_ARGUMENT_KEYS = ("arguments", "parameters")  # Llama writes "parameters", the others "arguments"


def call_from_object(text: str) -> ToolCall | None:
    """The call that the JSON object `text` ({"name": ..., "arguments": {...}}) describes, if it is one."""
    found = members(text)
    if found is None:
        return None
    name = found.get("name", (None, ""))[0]
    if not isinstance(name, str) or not name:
        return None
    arguments = "{}"  # a call of a function without parameters may leave them out
    for key in _ARGUMENT_KEYS:
        if key in found:
            arguments = arguments_text(*found[key])
            break
    return ToolCall(name, arguments) if arguments is not None else None


def calls_from_array(text: str) -> list[ToolCall] | None:
    """The calls in the JSON array `text`; None unless it holds at least one element and every one is a call."""
    found = elements(text)
    if not found:
        return None
    calls = [call_from_object(written) if isinstance(value, dict) else None for value, written in found]
    return None if None in calls else calls


def call_from_parts(name: str, arguments: str) -> ToolCall | None:
    """A call written as a bare name and a separate arguments object (Mistral's [ARGS] form)."""
    written = arguments_text(load(arguments), arguments)
    return ToolCall(name, written) if written is not None else None


def arguments_text(value: Any, written: str) -> str | None:
    """The arguments as JSON object text: as written when an object, the string's value when the model wrote the
    object inside a JSON string; None for anything else."""
    if isinstance(value, dict):
        return written
    if isinstance(value, str) and isinstance(load(value), dict):
        return value
    return None
