"""Gemma 4: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, several calls in one block separated by commas.

Values are JSON-like with bare keys, and strings quoted by Gemma's `<|"|>` token:
`<|tool_call>call:get_weather{location:<|"|>Paris<|"|>,days:3,units:{temp:<|"|>C<|"|>}}<tool_call|>`.
"""
from __future__ import annotations

import json
import re

from .base import Step, ToolCall
from .marked import MarkedToolParser
from .tagged import TaggedReasoningParser

END = "<tool_call|>"
QUOTE = '<|"|>'
_CALL = re.compile(r"\s*call:([\w.\-]+)(?=\{)")
_BARE = re.compile(r"[^\s{}\[\],:\"<]+")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def gemma_value(text: str, start: int) -> tuple[str, int] | None:
    """The JSON text of the object or array that opens at `start`, and where it ends; None if it is not one."""
    out: list[str] = []
    depth, position = 0, start
    while position < len(text):
        char = text[position]
        if text.startswith(QUOTE, position):
            close = text.find(QUOTE, position + len(QUOTE))
            if close < 0:
                return None
            out.append(json.dumps(text[position + len(QUOTE):close], ensure_ascii=False))
            position = close + len(QUOTE)
        elif char == '"':
            string = _JSON_STRING.match(text, position)
            if string is None:
                return None
            out.append(string.group())
            position = string.end()
        elif char in "{[":
            depth += 1
            out.append(char)
            position += 1
        elif char in "}]":
            depth -= 1
            out.append(char)
            position += 1
            if depth == 0:
                return "".join(out), position
        elif char in ",:" or char.isspace():
            out.append(char)
            position += 1
        elif bare := _BARE.match(text, position):
            key = text[bare.end():].lstrip().startswith(":")
            out.append(json.dumps(bare.group()) if key else bare.group())
            position = bare.end()
        else:
            return None
        if depth == 0:
            return None
    return None


def gemma_calls(body: str) -> list[ToolCall] | None:
    """The calls in one block's body: `call:NAME{...}` joined by commas; None unless it is exactly that."""
    calls, position = [], 0
    while True:
        head = _CALL.match(body, position)
        if head is None:
            return None
        value = gemma_value(body, head.end())
        if value is None:
            return None
        try:
            arguments = json.loads(value[0])
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(head.group(1), json.dumps(arguments, ensure_ascii=False)))
        rest = body[value[1]:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(","):
            return None
        position = len(body) - len(rest) + 1


class Gemma4ToolParser(MarkedToolParser):
    """A block is read once `<tool_call|>` has arrived, or at the end of the output. Guided generation is not
    offered: the arguments are not JSON."""

    name = "gemma4"
    marker = "<|tool_call>"
    trigger = "<|tool_call>"
    call_prefix = "<|tool_call>call:"
    call_suffix = "<tool_call|>"
    guidable = False

    def _call(self, buffer: str, final: bool) -> Step | None:
        return self._closed(buffer, final, END, gemma_calls)


class Gemma4ReasoningParser(TaggedReasoningParser):
    """Gemma 4's thinking channel: `<|channel>thought\n...<channel|>` before the answer; the channel markers are
    special tokens (OVMS's `gemma4`)."""

    name = "gemma4"
    open_tag = "<|channel>thought\n"
    end_tag = "<channel|>"
    needs_special_tokens = True
