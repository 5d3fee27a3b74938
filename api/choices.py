"""One choice of an answer as the API builds it: text through the output parser, log-probabilities, finish."""
from __future__ import annotations

from dataclasses import dataclass, field

from api.parsers import OutputParser, Parsed, ParsedDelta
from common.events import Delta, TokenLogprob


@dataclass
class ChoiceState:
    index: int
    parser: OutputParser | None = None
    top: int | None = None  # None: no log-probabilities; else how many alternatives per token (0 or 1)
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: str | None = None
    called: bool = False  # a tool call went out in the stream
    offset: int = 0  # characters of text so far: a completion's `text_offset`

    def add(self, delta: Delta) -> None:
        """Whole answers: keep everything for `parsed()` at the end."""
        self.text.append(delta.text)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            self.finish = delta.finish_reason

    def parsed(self) -> Parsed:
        text = "".join(self.text)
        if self.parser is None:
            return Parsed(text, None, [])
        return self.parser.parse(text, cut=self.finish == "length")

    def feed(self, delta: Delta) -> ParsedDelta:
        """Streams: what this delta adds, through the parser; at the choice's end, whatever it held back."""
        if delta.finish_reason:
            self.finish = delta.finish_reason
        if self.parser is None:
            return ParsedDelta(content=delta.text)
        out = self.parser.feed(delta.text) if delta.text else ParsedDelta()
        if delta.finish_reason:
            tail = self.parser.finish(cut=delta.finish_reason == "length")
            out = ParsedDelta(out.content + tail.content, out.reasoning + tail.reasoning,
                              out.tool_calls + tail.tool_calls)
        self.called = self.called or bool(out.tool_calls)
        return out

    def finish_reason(self, calls: bool) -> str | None:
        """OpenAI says `tool_calls` when the answer is calls, unless it was cut short."""
        if calls and self.finish == "stop":
            return "tool_calls"
        return self.finish
