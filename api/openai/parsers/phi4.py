"""Phi-4-mini: `functools[{"name": ..., "arguments": {...}}, ...]`, possibly after some text."""
from __future__ import annotations

from .base import Step
from .jsonscan import skip_ws
from .marked import MarkedToolParser


class Phi4ToolParser(MarkedToolParser):
    name = "phi4"
    marker = "functools"
    trigger = "functools["
    call_prefix = "functools["
    call_suffix = "]"
    separator = ", "
    calls_in_one_list = True

    def _call(self, buffer: str, final: bool) -> Step | None:
        return self._array(buffer, skip_ws(buffer, len(self.marker)), final)
