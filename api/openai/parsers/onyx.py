"""Onyx: calls in `<atem:...>` XML, one or more invocations per block:

    <atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="location">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls>

Values are raw text: JSON other than a string is taken as that, anything else as a string (OVMS looks the type up
in the tool's schema; this parser sees no schemas).
"""
from __future__ import annotations

import re

from .base import ReasoningParser, Step
from .text import before_marker
from .xmlcalls import XmlToolParser

TURN = "<|start|>assistant"
MESSAGE = "<|message|>"
ENDS = ("<|eom|>", "<|eot|>")  # a continuation turn's end (reasoning, calls); a final turn's end
_ENVELOPE = 128  # ` to=RECIPIENT<|message|>` is never longer (OVMS's bound)


class OnyxToolParser(XmlToolParser):
    name = "onyx"
    marker = "<atem:function_calls>"
    trigger = "<atem:function_calls>"
    call_prefix = "<atem:function_calls>\n"
    call_suffix = "\n</atem:function_calls>"
    end = "</atem:function_calls>"
    function = re.compile(r'\s*<atem:invoke name="([^"\n]+)">')
    parameter = re.compile(r'\s*<atem:parameter name="([^"\n]+)">\n?(.*?)\n?</atem:parameter>', re.DOTALL)
    close = re.compile(r"\s*</atem:invoke>")
    wrapper_close = re.compile(r"\s*</atem:function_calls>")


class OnyxReasoningParser(ReasoningParser):
    """Onyx answers in turns, `[<|start|>assistant] to=RECIPIENT<|message|>BODY<|eom|>` (or `<|eot|>` for the
    last): turns to `self` are the reasoning, every other body the content, without its framing (OVMS's `onyx`:
    its whole-output rules, streamed too). Text outside any envelope is content."""

    name = "onyx"
    end_tag = ENDS[0]
    needs_special_tokens = True

    def __init__(self, prompt_opened: bool = False) -> None:
        super().__init__(prompt_opened)
        self._head = True  # at the start of a turn: its framing comes first, if any
        self._reasoning_turn = False
        self._reasoned = False  # a later reasoning turn starts on a new line, as OVMS joins them

    @staticmethod
    def opens(prompt: str) -> bool:
        return False  # the prompt ends before the first turn's recipient: the output writes its own

    def _step(self, buffer: str, final: bool) -> Step | None:
        return self._frame(buffer, final) if self._head else self._body(buffer, final)

    def _frame(self, buffer: str, final: bool) -> Step | None:
        rest = buffer.lstrip(" ")
        skipped = len(buffer) - len(rest)
        if rest.startswith(TURN):
            return Step(skipped + len(TURN))
        if rest.startswith("to="):
            found = rest.find(MESSAGE, 0, _ENVELOPE + len(MESSAGE))
            if found >= 0:
                self._head, self._reasoning_turn = False, rest[3:found].strip() == "self"
                newline = "\n" if self._reasoning_turn and self._reasoned else ""
                self._reasoned |= self._reasoning_turn
                return Step(skipped + found + len(MESSAGE), reasoning=newline)
            if len(rest) < _ENVELOPE and not final:
                return None
        elif not rest:
            return None if not final else Step(len(buffer))
        elif not final and (TURN.startswith(rest) or "to=".startswith(rest)):
            return None
        self._head, self._reasoning_turn = False, False  # no envelope: the text is content as it is
        return self._body(buffer, final)

    def _body(self, buffer: str, final: bool) -> Step | None:
        plain = min(before_marker(buffer, marker, final) for marker in (*ENDS, TURN))
        if plain:
            text = buffer[:plain]
            return Step(plain, reasoning=text) if self._reasoning_turn else Step(plain, content=text)
        end = next((marker for marker in ENDS if buffer.startswith(marker)), None)
        if end is not None:
            self._head = True
            return Step(len(end))
        if buffer.startswith(TURN):
            self._head = True
            return self._frame(buffer, final)
        return None
