"""Formats where a marker (`<tool_call>`, `functools`, `[TOOL_CALLS]`) introduces calls anywhere in the text."""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import ClassVar

from .base import Step, ToolCall, ToolParser
from .calls import calls_from_array
from .jsonscan import NOT_JSON
from .text import before_marker


class MarkedToolParser(ToolParser):
    """Text streams as content up to the marker; what follows the marker is read as a call. If it turns out not
    to be one, the marker itself becomes content and reading resumes right after it, so the rest of that region
    stays content too and a good call further on is still found."""

    marker: ClassVar[str]

    def _step(self, buffer: str, final: bool) -> Step | None:
        # Output cut by the token limit: the start of a marker at its very end is held back as mid-stream (and
        # then dropped), not settled as text.
        plain = before_marker(buffer, self.marker, final and not self._cut)
        if plain:
            return Step(plain, content=buffer[:plain])
        if not buffer.startswith(self.marker):
            return self._unsettled(buffer, final)  # only the beginning of a marker so far
        return self._call(buffer, final)

    @abstractmethod
    def _call(self, buffer: str, final: bool) -> Step | None:
        """Read the call(s) `buffer` starts with (it starts with the marker)."""

    def _not_a_call(self) -> Step:
        return Step(len(self.marker), content=self.marker)

    def _unsettled(self, buffer: str, final: bool) -> Step | None:
        """`buffer` may start a call but needs more text. At the end of the output an unfinished call is no call,
        so it is content; unless the output was cut by the token limit: then it is dropped."""
        if not final:
            return None
        return Step(len(buffer)) if self._cut else self._not_a_call()

    def _array(self, buffer: str, start: int, final: bool) -> Step | None:
        """A JSON array of call objects at `start`, the whole array being the region's end."""
        end = self._json.end(buffer, start, "[")
        if end is None:
            return self._unsettled(buffer, final)
        calls = calls_from_array(buffer[start:end]) if end != NOT_JSON else None
        return Step(end, calls=calls) if calls else self._not_a_call()

    def _closed(self, buffer: str, final: bool, end: str, read: Callable[[str], list[ToolCall] | None]) -> Step | None:
        """The calls `read` finds between the marker and `end`, once `end` has arrived or the output has ended (the
        model may stop right after its calls); a region cut by the token limit is dropped."""
        close = buffer.find(end, len(self.marker))
        if close < 0 and not final:
            return None
        if close < 0 and self._cut:
            return Step(len(buffer))
        calls = read(buffer[len(self.marker):close if close >= 0 else len(buffer)])
        if calls is None:
            return self._not_a_call()
        return Step(close + len(end) if close >= 0 else len(buffer), calls=calls)
