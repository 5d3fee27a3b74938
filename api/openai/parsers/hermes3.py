"""Hermes 3 (also Qwen2.5/Qwen3): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks."""
from __future__ import annotations

from .base import Step, ToolCall
from .calls import call_from_object
from .jsonscan import NOT_JSON, skip_ws
from .marked import MarkedToolParser

END = "</tool_call>"


class Hermes3ToolParser(MarkedToolParser):
    """A block counts as a call as soon as its JSON is a complete call; the closing tag is optional because models
    often stop with EOS right after the JSON, and a closing tag cut off by the end of output belongs to the call."""

    name = "hermes3"
    marker = "<tool_call>"
    trigger = "<tool_call>"
    call_prefix = "<tool_call>\n"
    call_suffix = "\n</tool_call>"

    def _call(self, buffer: str, final: bool) -> Step | None:
        start = skip_ws(buffer, len(self.marker))
        end = self._json.end(buffer, start, "{")
        if end is None:
            return self._unsettled(buffer, final)
        call = call_from_object(buffer[start:end]) if end != NOT_JSON else None
        if call is None:
            return self._not_a_call()
        return self._closed(buffer, end, call, final)

    def _closed(self, buffer: str, end: int, call: ToolCall, final: bool) -> Step | None:
        after = skip_ws(buffer, end)
        if buffer.startswith(END, after):
            return Step(after + len(END), calls=[call])
        if not END.startswith(buffer[after:]):
            return Step(end, calls=[call])  # no closing tag: what follows the JSON is content again
        return Step(len(buffer), calls=[call]) if final else None
