"""gpt-oss: OpenAI's Harmony format. The answer is a run of messages, each a header and a body (shown wrapped):

    <|channel|>analysis<|message|>The user wants the weather. Call get_weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris"}
    <|call|>

or, answering, `<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>`. The `analysis` channel is the
reasoning; `final` and recipient-less `commentary` messages (preambles) are the content; a message addressed
`to=functions.NAME` (in the channel or the role part of its header) is a call whose body is the arguments
object. Messages for other recipients (built-in tools such as `browser.search`) are neither and are dropped.
The terminators `<|call|>` and `<|return|>` are end-of-sequence tokens, so the output may end without them.

The markers are special tokens: the text must be decoded with them kept (ovq does so whenever a tool parser or
`gptoss` reasoning parser applies).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .base import ReasoningParser, Step, ToolCall, ToolParser
from .calls import arguments_text
from .jsonscan import load
from .text import partial_marker

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
HEADS = (START, CHANNEL)  # what opens a message's header
ENDS = ("<|end|>", "<|call|>", "<|return|>")
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


def before_any(text: str, markers: tuple[str, ...], final: bool) -> int:
    """How much of `text` is surely before all of `markers` (see text.before_marker, for several)."""
    found = [index for index in (text.find(marker) for marker in markers) if index >= 0]
    if found:
        return min(found)
    return len(text) if final else len(text) - max(partial_marker(text, marker) for marker in markers)


@dataclass
class Header:
    """What a message is: `analysis` (reasoning), `content` (final answer or preamble), `call` or `other`."""

    kind: str
    name: str = ""

    @classmethod
    def read(cls, text: str) -> Header:
        recipient = _RECIPIENT.search(text)
        if recipient is not None and recipient.group(1) != "user":  # `to=user` is a message for the user
            target = recipient.group(1)
            if target.startswith(FUNCTIONS) and len(target) > len(FUNCTIONS):
                return cls("call", target[len(FUNCTIONS):])
            return cls("other")
        channel = _CHANNEL.search(text)
        return cls("analysis" if channel is not None and channel.group(1) == "analysis" else "content")


@dataclass
class Piece:
    """One settled stretch of Harmony text. `role`: text (outside any message), header, body, end, call (a whole
    call message: header, arguments, terminator) or skip (a broken header or stray terminator)."""

    size: int
    role: str
    text: str = ""
    header: Header | None = None
    call: ToolCall | None = None


class HarmonyReader:
    """The one decision procedure both gpt-oss parsers cut the output with, so they agree on every message."""

    def __init__(self) -> None:
        self.header: Header | None = None  # the message being read; None between messages

    def read(self, buffer: str, final: bool, cut: bool) -> Piece | None:
        if self.header is not None:
            return self._body(buffer, final, cut)
        if buffer.startswith(HEADS):
            return self._header(buffer, final, cut)
        for end in ENDS:
            if buffer.startswith(end):
                return Piece(len(end), "skip")
        plain = before_any(buffer, HEADS + ENDS, final)
        return Piece(plain, "text", buffer[:plain]) if plain else None

    def _header(self, buffer: str, final: bool, cut: bool) -> Piece | None:
        opened = buffer.find(MESSAGE)
        if opened < 0:
            return Piece(len(buffer), "skip") if final else None  # a header cut short says nothing
        header = Header.read(buffer[:opened])
        start = opened + len(MESSAGE)
        if header.kind == "call":
            return self._call(buffer, start, header, final, cut)
        self.header = header
        return Piece(start, "header", buffer[:start], header)

    def _body(self, buffer: str, final: bool, cut: bool) -> Piece | None:
        plain = before_any(buffer, HEADS + ENDS, final)
        if plain:
            return Piece(plain, "body", buffer[:plain], self.header)
        header, self.header = self.header, None
        for end in ENDS:
            if buffer.startswith(end):
                return Piece(len(end), "end", end, header)
        if buffer.startswith(HEADS):  # a new message without the old one's terminator
            return self.read(buffer, final, cut)
        self.header = header
        return None

    @staticmethod
    def _call(buffer: str, start: int, header: Header, final: bool, cut: bool) -> Piece | None:
        """A call is settled whole: its arguments end at a terminator, the next message or the output's end."""
        ended = [(index, marker) for marker in HEADS + ENDS if (index := buffer.find(marker, start)) >= 0]
        if ended:
            index, marker = min(ended)
            size = index + (len(marker) if marker in ENDS else 0)
        elif not final:
            return None
        else:
            index = size = len(buffer)
        written = buffer[start:index].strip()
        arguments = arguments_text(load(written), written) if written else "{}"
        if arguments is None and not ended and cut:
            return Piece(size, "skip")  # cut by the token limit while writing the arguments
        call = ToolCall(header.name, arguments) if arguments is not None else None
        return Piece(size, "call", buffer[:size], header, call)


class GptOssToolParser(ToolParser):
    """Content is the final answer and the preambles; analysis is left to the `gptoss` reasoning parser (dropped
    here when there is none). A call whose arguments are not a JSON object stays content, as written. Guided
    generation is not offered: the call's header is special tokens, which a grammar cannot ask for."""

    name = "gptoss"
    trigger = CHANNEL
    call_prefix = ""
    call_suffix = ""
    guidable = False

    def __init__(self, forced: bool = False) -> None:
        super().__init__(forced)
        self._reader = HarmonyReader()

    def _step(self, buffer: str, final: bool) -> Step | None:
        piece = self._reader.read(buffer, final, self._cut)
        if piece is None:
            return None
        if piece.role == "call":
            return Step(piece.size, calls=[piece.call]) if piece.call else Step(piece.size, content=piece.text)
        kind = piece.header.kind if piece.header else "content"
        return Step(piece.size, content=piece.text if piece.role in ("text", "body") and kind == "content" else "")


class GptOssReasoningParser(ReasoningParser):
    """Analysis messages are the reasoning; final and preamble bodies the content, without their headers. Call
    messages go on whole, as written, for the `gptoss` tool parser to read (or as text when there is none)."""

    name = "gptoss"
    end_tag = ENDS[0]
    needs_special_tokens = True

    def __init__(self, prompt_opened: bool = False) -> None:
        super().__init__(prompt_opened)
        self._reader = HarmonyReader()

    @staticmethod
    def opens(prompt: str) -> bool:
        return False  # the prompt ends at `<|start|>assistant`: the output writes its own header

    def _step(self, buffer: str, final: bool) -> Step | None:
        piece = self._reader.read(buffer, final, False)
        if piece is None:
            return None
        if piece.role == "call":
            return Step(piece.size, content=piece.text)
        kind = piece.header.kind if piece.header else "content"
        if piece.role not in ("text", "body") or kind == "other":
            return Step(piece.size)
        return Step(piece.size, reasoning=piece.text) if kind == "analysis" else Step(piece.size, content=piece.text)
