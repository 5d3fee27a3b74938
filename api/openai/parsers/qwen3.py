"""Qwen3 reasoning: `<think>\n...\n</think>\n\nanswer`, or, when the prompt already opened the block, reasoning
from the first character up to `</think>`."""
from __future__ import annotations

from .base import ReasoningParser, Step
from .text import before_marker

OPEN = "<think>"
CLOSE = "</think>"


class Qwen3ReasoningParser(ReasoningParser):
    """Only a `<think>` at the start (after whitespace) opens reasoning; one that is never closed leaves the rest
    of the output reasoning (thinking cut off by max_tokens). Tags elsewhere in the answer are plain text."""

    name = "qwen3"
    end_tag = CLOSE

    def __init__(self, prompt_opened: bool = False) -> None:
        super().__init__(prompt_opened)
        self._state = "thinking" if prompt_opened else "start"  # start -> thinking -> answer

    @staticmethod
    def opens(prompt: str) -> bool:
        return prompt.rstrip().endswith(OPEN)

    def _step(self, buffer: str, final: bool) -> Step | None:
        if self._state == "start":
            return self._start(buffer, final)
        if self._state == "thinking":
            return self._thinking(buffer, final)
        return Step(len(buffer), content=buffer)

    def _start(self, buffer: str, final: bool) -> Step | None:
        rest = buffer.lstrip()
        if rest.startswith(OPEN):
            self._state = "thinking"
            return Step(len(buffer) - len(rest) + len(OPEN))
        if OPEN.startswith(rest) and not final:
            return None
        self._state = "answer"
        return Step(len(buffer), content=buffer)

    def _thinking(self, buffer: str, final: bool) -> Step | None:
        plain = before_marker(buffer, CLOSE, final)
        if plain:
            return Step(plain, reasoning=buffer[:plain])
        if not buffer.startswith(CLOSE):
            return None
        self._state = "answer"
        return Step(len(CLOSE))
