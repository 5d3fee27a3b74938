"""Calls written as XML with named parameters and raw-text values (OVMS's onyx and minicpm5 formats)."""
from __future__ import annotations

import ast
import json
import re
from typing import Any, ClassVar

from .base import Step, ToolCall
from .marked import MarkedToolParser
from .qwen3coder import parameter_value


def xml_value(text: str) -> Any:
    """A value as text: what it reads as in JSON when that is not a string (else the text), also Python-quoted
    lists and objects (`['a', 'b']`), which these models write too."""
    value = parameter_value(text)
    stripped = text.strip()
    if isinstance(value, str) and stripped[:1] in ("[", "{"):
        try:
            literal = ast.literal_eval(stripped)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return value
        if isinstance(literal, list | dict):
            return json.loads(json.dumps(literal, default=str))
    return value


class XmlToolParser(MarkedToolParser):
    """A region from `marker` to `end` holds one or more functions, each `function` (its name the first group)
    followed by parameters (`parameter`: name, value) and `close`. A region is read once `end` has arrived;
    whatever is not exactly that is not a call. Guided generation is not offered (the values are not JSON)."""

    end: ClassVar[str]
    function: ClassVar[re.Pattern[str]]
    parameter: ClassVar[re.Pattern[str]]
    close: ClassVar[re.Pattern[str]]
    wrapper_close: ClassVar[re.Pattern[str] | None] = None  # what follows the last function inside the region
    guidable = False

    def _call(self, buffer: str, final: bool) -> Step | None:
        end = buffer.find(self.end, len(self.marker))
        if end < 0:
            return self._unsettled(buffer, final)
        end += len(self.end)
        calls = self._read(buffer[:end])
        return Step(end, calls=calls) if calls else self._not_a_call()

    def _read(self, region: str) -> list[ToolCall] | None:
        calls: list[ToolCall] = []
        position = self._opening(region)
        while (function := self.function.match(region, position)) is not None:
            arguments: dict[str, Any] = {}
            position = function.end()
            while parameter := self.parameter.match(region, position):
                arguments.setdefault(parameter.group(1), xml_value(parameter.group(2)))
                position = parameter.end()
            closed = self.close.match(region, position)
            if closed is None:
                return None
            calls.append(ToolCall(function.group(1), json.dumps(arguments, ensure_ascii=False)))
            position = closed.end()
        if self.wrapper_close is not None and not self.wrapper_close.fullmatch(region, position):
            return None
        return calls if calls and (self.wrapper_close is not None or position == len(region)) else None

    def _opening(self, region: str) -> int:
        """Where the first function starts in a region."""
        return len(self.marker)
