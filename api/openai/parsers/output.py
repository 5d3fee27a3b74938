"""The whole output pipeline of one answer: reasoning first, then tool calls in what is left.

Tool calls are only looked for in the content, never inside reasoning: models think aloud about the calls they
are about to make, in the very format that would otherwise be taken for a call.
"""
from __future__ import annotations

from .base import Parsed, ParsedDelta, ReasoningParser, ToolParser


class OutputParser:
    """Without any parser the text passes through untouched (only "" becomes None)."""

    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    def parse(self, text: str, cut: bool = False) -> Parsed:
        """`cut`: the output ended at the token limit (see ToolParser)."""
        reasoning, content = self.reasoning.parse(text) if self.reasoning else (None, text or None)
        if self.tools is None:
            return Parsed(content, reasoning, [])
        content, calls = self.tools.parse(content or "", cut)
        return Parsed(content, reasoning, calls)

    def feed(self, chunk: str) -> ParsedDelta:
        return self._tools(self.reasoning.feed(chunk) if self.reasoning else ParsedDelta(content=chunk), False)

    def finish(self, cut: bool = False) -> ParsedDelta:
        return self._tools(self.reasoning.finish() if self.reasoning else ParsedDelta(), True, cut)

    def _tools(self, delta: ParsedDelta, final: bool, cut: bool = False) -> ParsedDelta:
        if self.tools is None:
            return delta
        found = self.tools.feed(delta.content)
        if final:
            rest = self.tools.finish(cut)
            found.content += rest.content
            found.tool_calls += rest.tool_calls
        return ParsedDelta(found.content, delta.reasoning, found.tool_calls)
