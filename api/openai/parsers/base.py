"""What output parsers produce, and the interfaces the tool-call and reasoning parsers implement.

Every parser is one decision procedure, `_step`, used two ways: over the whole output at once (parse) and over a
buffer that grows chunk by chunk (feed/finish). `_step` only decides once the text it has seen settles the
question (otherwise it asks for more), so both ways cut the output at the same places and agree exactly.
"""
from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from common.structured import Node, json_schema, tag, tags_with_separator, triggered_tags

from .jsonscan import JsonScanner
from .text import Trimmer


@dataclass
class Function:
    """A tool the client offers: its name and the JSON schema of its arguments object."""

    name: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass
class ToolCall:
    """One complete call; `arguments` is the JSON text of the arguments object as the model wrote it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass
class ToolCallDelta:
    """One OpenAI streaming fragment of a call; id and name come only with a call's first fragment."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    """What one chunk of model text adds to the answer."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass
class Parsed:
    """A whole answer."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]


@dataclass
class Step:
    """One decision: the first `size` characters of the buffer are settled, and this is what they were."""

    size: int
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)


class Stepper(ABC):
    """Runs `_step` over a buffer; `final` tells it no more text will come, so it must settle everything."""

    def __init__(self) -> None:
        self._buffer = ""

    @abstractmethod
    def _step(self, buffer: str, final: bool) -> Step | None:
        """Settle a non-empty start of `buffer`, or return None while that needs more text (never when final)."""

    def _advance(self, chunk: str, final: bool) -> list[Step]:
        self._buffer += chunk
        steps: list[Step] = []
        while self._buffer:
            step = self._step(self._buffer, final)
            if step is None and not final:
                break
            if step is None or step.size <= 0:  # would lose text or loop forever: a parser bug, not bad output
                raise RuntimeError(f"{type(self).__name__} cannot settle {self._buffer[:40]!r}")
            self._buffer = self._buffer[step.size:]
            steps.append(step)
        return steps


def joined(pieces: list[str]) -> str | None:
    """Whole-output counterpart of Trimmer: the pieces joined, stripped, None when nothing is left."""
    return "".join(pieces).strip() or None


class ToolParser(Stepper):
    """Splits a model's answer into content and tool calls. One instance serves one answer.

    Calls are emitted whole, one fragment each, once they are complete and well-formed: nothing sent is ever
    retracted. A call region that does not parse is not a call and stays in the content, with two exceptions:
    - `forced` (tool_choice `required` or a named function): the grammar allowed nothing but calls, so nothing is
      content; whatever is not a complete call (a call cut short) is dropped.
    - `cut` (the output ended at the token limit): an unfinished call at the end, or the start of a marker, is
      dropped rather than shown as content: it was never meant as text, and it was cut, not malformed.
    """

    name: ClassVar[str]
    # Guided generation: the text that starts a call's tag and the text around the call's JSON object.
    trigger: ClassVar[str]
    call_prefix: ClassVar[str]
    call_suffix: ClassVar[str]
    arguments_key: ClassVar[str] = "arguments"
    # A forced answer: what the model writes between two calls (calls_in_one_list: between the list's elements,
    # the list being call_prefix ... call_suffix once for all of them).
    separator: ClassVar[str] = "\n"
    calls_in_one_list: ClassVar[bool] = False
    # Whether `guided` can write this format (JSON arguments inside fixed text); False: no guided generation.
    guidable: ClassVar[bool] = True

    def __init__(self, forced: bool = False) -> None:
        super().__init__()
        self.forced = forced
        self._cut = False
        self._content = Trimmer()
        self._count = 0
        self._json = JsonScanner()

    def parse(self, text: str, cut: bool = False) -> tuple[str | None, list[ToolCall]]:
        parser = type(self)(self.forced)
        parser._cut = cut
        steps = parser._advance(text, final=True)
        content = None if self.forced else joined([step.content for step in steps])
        return content, [self._with_id(call) for step in steps for call in step.calls]

    @staticmethod
    def call_id() -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def _with_id(self, call: ToolCall) -> ToolCall:
        call.id = self.call_id()
        return call

    def feed(self, chunk: str) -> ParsedDelta:
        return self._delta(self._advance(chunk, final=False))

    def finish(self, cut: bool = False) -> ParsedDelta:
        self._cut = cut
        return self._delta(self._advance("", final=True))

    def guided(self, tools: list[Function], required: bool, parallel: bool) -> Node:
        """A structural tag that makes the model write calls in this parser's format, with schema-valid arguments.

        Left free (`auto`), the model writes text and a call starts where it writes the trigger. Forced, the output
        is the call(s) and nothing else: the grammar ends after the last call, so only the end of sequence can
        follow (one call unless `parallel`, then as many as the model writes, separated by `separator`).
        """
        if not tools:
            raise ValueError("guided tool calling needs at least one tool")
        if required:
            return self._calls_only(tools, parallel)
        tags = [self._tag(tool, self.call_prefix, self.call_suffix) for tool in tools]
        return triggered_tags([self.trigger], tags, at_least_one=False, stop_after_first=not parallel)

    def _calls_only(self, tools: list[Function], parallel: bool) -> Node:
        if self.calls_in_one_list:
            elements = [self._tag(tool, "", "") for tool in tools]
            listed = tags_with_separator(elements, self.separator, at_least_one=True, stop_after_first=not parallel)
            return tag(self.call_prefix, listed, self.call_suffix)
        tags = [self._tag(tool, self.call_prefix, self.call_suffix) for tool in tools]
        return tags_with_separator(tags, self.separator, at_least_one=True, stop_after_first=not parallel)

    def _tag(self, tool: Function, prefix: str, suffix: str) -> Node:
        name = json.dumps(tool.name, ensure_ascii=False)
        begin = f'{prefix}{{"name": {name}, "{self.arguments_key}": '
        return tag(begin, json_schema(tool.parameters), "}" + suffix)

    def _delta(self, steps: list[Step]) -> ParsedDelta:
        content = "" if self.forced else "".join(self._content.push(step.content) for step in steps)
        delta = ParsedDelta(content=content)
        for call in (self._with_id(call) for step in steps for call in step.calls):
            delta.tool_calls.append(ToolCallDelta(self._count, call.id, call.name, call.arguments))
            self._count += 1
        return delta


class ReasoningParser(Stepper):
    """Splits a model's output into reasoning and content. One instance serves one answer."""

    name: ClassVar[str]
    end_tag: ClassVar[str]  # what closes the reasoning: constraints on the answer start after it
    needs_special_tokens: ClassVar[bool] = False  # its markers are special tokens the decoder must keep

    def __init__(self, prompt_opened: bool = False) -> None:
        super().__init__()
        self.prompt_opened = prompt_opened
        self._reasoning = Trimmer()
        self._content = Trimmer()

    def parse(self, text: str) -> tuple[str | None, str | None]:
        steps = type(self)(self.prompt_opened)._advance(text, final=True)
        return joined([step.reasoning for step in steps]), joined([step.content for step in steps])

    def feed(self, chunk: str) -> ParsedDelta:
        return self._delta(self._advance(chunk, final=False))

    def finish(self) -> ParsedDelta:
        return self._delta(self._advance("", final=True))

    @staticmethod
    @abstractmethod
    def opens(prompt: str) -> bool:
        """Whether this rendered prompt ends inside an open reasoning block, so the output starts in reasoning."""

    def _delta(self, steps: list[Step]) -> ParsedDelta:
        return ParsedDelta(
            content="".join(self._content.push(step.content) for step in steps),
            reasoning="".join(self._reasoning.push(step.reasoning) for step in steps),
        )
