"""One choice of an answer as the API builds it: text through the output parser, log-probabilities, finish.

Events are the worker's plain dicts (`common.events.DeltaEvent`): this is the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from api.openai.parsers import OutputParser, Parsed, ParsedDelta
from common.events import DeltaEvent, TokenLogprobDict


@dataclass(eq=False)  # identity: a response keys its choices' pending texts by the choice itself
class ChoiceState:
    index: int  # in the answer: prompt_index * n + the job's own choice index
    parser: OutputParser | None = None
    top: int | None = None  # None: no log-probabilities; else how many alternatives per token (0 or 1)
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobDict] = field(default_factory=list)
    finish: str | None = None
    called: bool = False  # a tool call went out in the stream
    offset: int = 0  # characters of text so far: a completion's `text_offset`

    @property
    def plain(self) -> bool:
        """Text goes out as it comes: no parser, no log-probabilities (the fast path)."""
        return self.parser is None and self.top is None

    def add(self, delta: DeltaEvent) -> None:
        """Whole answers: keep everything for `parsed()` at the end."""
        self.text.append(delta["text"])
        if delta.get("logprobs"):
            self.logprobs.extend(delta["logprobs"])
        if delta.get("finish_reason"):
            self.finish = delta["finish_reason"]

    def parsed(self) -> Parsed:
        text = "".join(self.text)
        if self.parser is None:
            return Parsed(text, None, [])
        return self.parser.parse(text, cut=self.finish == "length")

    def feed(self, delta: DeltaEvent) -> ParsedDelta:
        """Streams: what this delta adds, through the parser; at the choice's end, whatever it held back."""
        finish = delta.get("finish_reason")
        if finish:
            self.finish = finish
        if self.parser is None:
            return ParsedDelta(content=delta["text"])
        out = self.parser.feed(delta["text"]) if delta["text"] else ParsedDelta()
        if finish:
            tail = self.parser.finish(cut=finish == "length")
            out = ParsedDelta(out.content + tail.content, out.reasoning + tail.reasoning,
                              out.tool_calls + tail.tool_calls)
        self.called = self.called or bool(out.tool_calls)
        return out

    def finish_reason(self, calls: bool) -> str | None:
        """OpenAI says `tool_calls` when the answer is calls, unless it was cut short."""
        if calls and self.finish == "stop":
            return "tool_calls"
        return self.finish
