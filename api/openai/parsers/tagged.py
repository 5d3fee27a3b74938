"""Reasoning between an opening and a closing tag at the start of the answer (`<think>...</think>` and its kin):
Qwen3, LFM2, MiniCPM 5 and Gemma 4 differ only in their tags and in whether the tags are special tokens."""
from __future__ import annotations

from typing import ClassVar

from .base import ReasoningParser, Step
from .text import before_marker


class TaggedReasoningParser(ReasoningParser):
    """Only an opening tag at the start (after whitespace) opens reasoning; one that is never closed leaves the rest
    of the output reasoning (thinking cut off by max_tokens). Tags elsewhere in the answer are plain text."""

    open_tag: ClassVar[str]

    def __init__(self, prompt_opened: bool = False) -> None:
        super().__init__(prompt_opened)
        self._state = "thinking" if prompt_opened else "start"  # start -> thinking -> answer

    @classmethod
    def opens(cls, prompt: str) -> bool:
        return prompt.rstrip().endswith(cls.open_tag.rstrip())

    def _step(self, buffer: str, final: bool) -> Step | None:
        if self._state == "start":
            return self._start(buffer, final)
        if self._state == "thinking":
            return self._thinking(buffer, final)
        return Step(len(buffer), content=buffer)

    def _start(self, buffer: str, final: bool) -> Step | None:
        rest = buffer.lstrip()
        if rest.startswith(self.open_tag):
            self._state = "thinking"
            return Step(len(buffer) - len(rest) + len(self.open_tag))
        if self.open_tag.startswith(rest) and not final:
            return None
        self._state = "answer"
        return Step(len(buffer), content=buffer)

    def _thinking(self, buffer: str, final: bool) -> Step | None:
        plain = before_marker(buffer, self.end_tag, final)
        if plain:
            return Step(plain, reasoning=buffer[:plain])
        if not buffer.startswith(self.end_tag):
            return None
        self._state = "answer"
        return Step(len(self.end_tag))
