"""Qwen3-Coder: XML calls, one `<tool_call>` block each:

    <tool_call>
    <function=get_weather>
    <parameter=location>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text, not JSON: a value that reads as JSON (a number, true, an object...) is taken as
that, anything else as a string (OVMS looks the type up in the tool's schema; this parser sees no schemas).
"""
from __future__ import annotations

import json
import re
from typing import Any

from .base import Step, ToolCall
from .jsonscan import load
from .marked import MarkedToolParser

END_FUNCTION = "</function>"
END = "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_CLOSE = re.compile(r"\s*" + re.escape(END_FUNCTION))
_SPACE = re.compile(r"\s*")


def parameter_value(text: str) -> Any:
    """A parameter's text as a JSON value: what it reads as when that is not a string, else the text itself."""
    stripped = text.strip()
    if stripped == "null":
        return None
    value = load(stripped)
    return text if value is None or isinstance(value, str) else value


class Qwen3CoderToolParser(MarkedToolParser):
    """A block is a call once its `</function>` has arrived; the closing `</tool_call>` is optional (a model may
    stop right after `</function>`). Guided generation is not offered: the grammar would have to write XML from
    each tool's schema, which ovq's structural tags do not express."""

    name = "qwen3coder"
    marker = "<tool_call>"
    trigger = "<tool_call>"
    call_prefix = "<tool_call>\n"
    call_suffix = "\n</tool_call>"
    guidable = False

    def _call(self, buffer: str, final: bool) -> Step | None:
        end = buffer.find(END_FUNCTION, len(self.marker))
        if end < 0:
            return self._unsettled(buffer, final)
        end += len(END_FUNCTION)
        call = _read_call(buffer[len(self.marker):end])
        if call is None:
            return self._not_a_call()
        closing = _SPACE.match(buffer, end).end()
        rest = buffer[closing:]
        if rest.startswith(END):
            return Step(closing + len(END), calls=[call])
        if END.startswith(rest):  # the closing tag may be arriving, or was cut off at the end
            return Step(len(buffer), calls=[call]) if final else None
        return Step(end, calls=[call])  # no closing tag: what follows is content again


def _read_call(block: str) -> ToolCall | None:
    """The call one `<function=...>...</function>` block describes, or None when it is not exactly that."""
    function = _FUNCTION.match(block)
    if function is None:
        return None
    arguments: dict[str, Any] = {}
    position = function.end()
    while parameter := _PARAMETER.match(block, position):
        arguments[parameter.group(1).strip()] = parameter_value(parameter.group(2))
        position = parameter.end()
    if not _CLOSE.fullmatch(block, position):
        return None
    return ToolCall(function.group(1).strip(), json.dumps(arguments, ensure_ascii=False))
