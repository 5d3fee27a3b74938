"""Llama 3.1/3.2 JSON tool calling: the output is `<|python_tag|>`-optional `{"name": ..., "parameters": {...}}`,
several calls separated by `;`. Calls are only recognised at the very start of the output, because these models
answer either with calls or with text; text after the last call is content."""
from __future__ import annotations

from .base import Step, ToolParser
from .calls import call_from_object
from .jsonscan import NOT_JSON, skip_ws

PYTHON_TAG = "<|python_tag|>"
CALL_START = '{"name"'


class Llama3ToolParser(ToolParser):
    """Guided generation uses the bare JSON form: `<|python_tag|>` is a special token, not text a grammar can ask
    for. Left free (tool_choice auto), the model may still write text before a call; that call is then content."""

    name = "llama3"
    trigger = '{"name": '
    call_prefix = ""
    call_suffix = ""
    arguments_key = "parameters"
    separator = "; "

    def __init__(self, forced: bool = False) -> None:
        super().__init__(forced)
        self._state = "start"  # start -> calls (after the first call) -> text (everything else is content)

    def _step(self, buffer: str, final: bool) -> Step | None:
        if self._state == "text":
            return Step(len(buffer), content=buffer)
        start = self._opening(buffer) if self._state == "start" else self._separator(buffer)
        if final and self._state == "calls" and start == len(buffer):
            return Step(len(buffer))  # a separator left dangling at the end is part of the calls, not an answer
        end = self._json.end(buffer, start, "{") if start is not None else None
        if end is None:
            if not final:
                return None
            # Cut by the token limit, a call being written (or its python tag arriving) is dropped, not content.
            return Step(len(buffer)) if self._cut and self._call_begun(buffer, start) else self._text(buffer)
        call = call_from_object(buffer[start:end]) if end != NOT_JSON else None
        if call is None:
            return self._text(buffer)
        self._state = "calls"
        return Step(end, calls=[call])

    @staticmethod
    def _opening(buffer: str) -> int | None:
        """Where the first call's JSON would start; None while a python tag may still be arriving."""
        start = skip_ws(buffer, 0)
        if buffer.startswith(PYTHON_TAG, start):
            return skip_ws(buffer, start + len(PYTHON_TAG))
        return None if PYTHON_TAG.startswith(buffer[start:]) else start

    @staticmethod
    def _call_begun(buffer: str, start: int | None) -> bool:
        """Whether the unfinished text at `start` is a call being written: after the python tag, or JSON whose
        first key is (or may still become) "name"."""
        if start is None or PYTHON_TAG in buffer[:start]:
            return True
        written = "".join(buffer[start:].split())[: len(CALL_START)]
        return CALL_START.startswith(written)

    @staticmethod
    def _separator(buffer: str) -> int:
        """Where the next call's JSON would start after the previous call: past whitespace and one `;`."""
        start = skip_ws(buffer, 0)
        return skip_ws(buffer, start + 1) if buffer.startswith(";", start) else start

    def _text(self, buffer: str) -> Step:
        self._state = "text"
        return Step(len(buffer), content=buffer)
