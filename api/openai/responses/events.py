"""A response as it is generated: chat-level deltas in, OpenAI's Responses stream events out, and the final
`Response` built from the same state, so a streamed answer and a whole one agree.

Feed it what the chat path has per step (`ChoiceState.feed`'s `ParsedDelta`, or the plain text, with the worker's
log-probability entries) and the finish (reason, usage). Output items open and close one at a time, in the order
the model wrote them: a `reasoning` item for reasoning text, a `message` for the answer, a `function_call` per
call. Whitespace alone does not open a message (a reasoning model writes "\\n\\n" between its reasoning and its
calls); it is kept for the message that follows, or dropped when none does (an answer with no item at all is
still one message, with whatever text it had).

Events are typed dicts (`protocol.StreamEvent`), not models: one is made per streamed step, and a dict costs a
fraction of a pydantic model. Items and the response inside events are dumped when the event is made, so an
event never changes after it went out.

Every event is stamped with the next sequence number (from 0, or from where a resumed stream left off); `render`
writes them as SSE with the `event:` line OpenAI sends, and an `id:` line equal to the sequence number when asked,
so a client can resume after the last one it saw.
"""
from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from api.openai.parsers import Parsed, ParsedDelta, ToolCallDelta
from api.openai.responses.protocol import (
    ERROR_CODES,
    ContentPartEvent,
    ConversationRef,
    ErrorEvent,
    FunctionCall,
    IncompleteDetails,
    Logprob,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    Reasoning,
    ReasoningConfig,
    ReasoningText,
    Response,
    ResponseError,
    ResponseEvent,
    ResponsesRequest,
    StreamEvent,
    Usage,
)
from common.errors import ErrorBody

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def counted_ids(seed: str) -> Callable[[str], str]:
    """Item ids numbered from `seed` in the order they are made: folding the same events again gives the same ids."""
    numbers = itertools.count()
    return lambda prefix: f"{prefix}_{seed}{next(numbers):04x}"


def initial_response(body: ResponsesRequest, response_id: str | None = None, created_at: int | None = None,
                     sampling: Mapping[str, float] | None = None, tier: str = "default") -> Response:
    """The response object before any output: the request's settings echoed, `queued` for background ones.

    `sampling`: the model's defaults (its card's), for what the request left unset; `tier`: the service tier it is
    served at (api/queue/priority.py)."""
    return Response(
        id=response_id or new_id("resp"), created_at=int(time.time()) if created_at is None else created_at,
        status="queued" if body.background else "in_progress", background=body.background,
        instructions=body.instructions, max_output_tokens=body.max_output_tokens, max_tool_calls=body.max_tool_calls,
        model=body.model, parallel_tool_calls=body.parallel_tool_calls, previous_response_id=body.previous_response_id,
        reasoning=body.reasoning or ReasoningConfig(), store=body.store, text=body.text, tool_choice=body.tool_choice,
        tools=body.tools, top_logprobs=body.top_logprobs or 0, truncation=body.truncation, user=body.user,
        metadata=body.metadata or {}, service_tier=tier, safety_identifier=body.safety_identifier,
        prompt_cache_key=body.prompt_cache_key, **used_sampling(body, sampling or {}),
        conversation=ConversationRef(id=body.conversation_id) if body.conversation_id else None)


def used_sampling(body: ResponsesRequest, sampling: Mapping[str, float]) -> dict[str, float]:
    """Each sampling number the response reports: the request's (penalties are ovq's extensions, in its extra
    fields), else the model's default, else the response object's own (OpenAI's)."""
    asked = {"temperature": body.temperature, "top_p": body.top_p, **(body.model_extra or {})}
    used = {}
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = asked.get(name)
        value = value if isinstance(value, (int, float)) and not isinstance(value, bool) else sampling.get(name)
        if value is not None:
            used[name] = float(value)
    return used


def usage_of(usage: Mapping[str, int] | None) -> Usage:
    """Chat's usage as the Responses API counts it (ovq does not count reasoning tokens apart: 0)."""
    usage = usage or {}
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return Usage(input_tokens=prompt, output_tokens=completion,
                 total_tokens=usage.get("total_tokens", prompt + completion))


def error_of(error: ErrorBody | Mapping[str, Any], status: int = 500) -> ResponseError:
    """A failed response's error: the code one of OpenAI's for failed responses (the SDK takes no other), the
    nearest by HTTP status where ovq's own code is not one; message, param and type as they were."""
    body = error if isinstance(error, ErrorBody) else ErrorBody.model_validate(error)
    code = body.code if body.code in ERROR_CODES else \
        "rate_limit_exceeded" if status == 429 else "server_error" if status >= 500 else "invalid_prompt"
    return ResponseError(code=str(code), message=body.message, param=body.param, type=body.type)


@dataclass(eq=False)
class _Item:
    """An output item being written: its text comes in pieces, joined once when it closes."""

    item: OutputMessage | FunctionCall | Reasoning
    index: int
    id: str
    pieces: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class ResponseStream:
    """The state of one response: what has been written, and the events that said so."""

    def __init__(self, response: Response, sequence: int = 0, logprobs: int | None = None,
                 ids: Callable[[str], str] = new_id) -> None:
        """`sequence`: the next event's number (0, or where a resumed stream left off); `logprobs`: None, or how
        many alternatives per token the client asked for (the chat request's `top_logprobs`); `ids`: makes each
        item's id from its prefix (`counted_ids`: the same ids whenever a journal is folded again)."""
        self.response = response
        self.new_id = ids
        self.sequence = sequence
        self.top = logprobs
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._space = ""  # whitespace that has not opened a message (yet)
        self._space_logprobs: list[dict[str, Any]] = []

    # ---- the response's life ----

    def created(self) -> list[StreamEvent]:
        """`response.created` (and `response.queued` for a response that waits in the background)."""
        events = [self._response_event("response.created")]
        if self.response.status == "queued":
            events.append(self._response_event("response.queued"))
        return events

    def in_progress(self) -> list[StreamEvent]:
        """`response.in_progress`: a worker took the job."""
        self.response.status = "in_progress"
        return [self._response_event("response.in_progress")]

    def start(self) -> list[StreamEvent]:
        return self.created() + self.in_progress()

    def feed(self, delta: ParsedDelta, logprobs: list[dict[str, Any]] | None = None) -> list[StreamEvent]:
        """One chat-level step: reasoning, answer text, call fragments, as the output parser split them.

        `logprobs` are the worker's entries of this step; they go with the answer text (none is shown for
        reasoning or calls, as chat does)."""
        events: list[StreamEvent] = []
        if delta.reasoning:
            events += self.reasoning(delta.reasoning)
        if delta.content:
            events += self.text(delta.content, logprobs)
        for call in delta.tool_calls:
            events += self.call(call)
        return events

    def text(self, text: str, logprobs: list[dict[str, Any]] | None = None) -> list[StreamEvent]:
        entries = self._entries(logprobs)
        events: list[StreamEvent] = []
        if not isinstance(self._open.item if self._open else None, OutputMessage):
            if not (self._space + text).strip():
                self._space += text
                self._space_logprobs += entries
                return []
            events += self._close("completed")
            events += self._open_message()
            text, entries = self._space + text, self._space_logprobs + entries
            self._space, self._space_logprobs = "", []
        return events + self._text(text, entries)

    def reasoning(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if not isinstance(self._open.item if self._open else None, Reasoning):
            events += self._close("completed")
            opened, added = self._add(Reasoning(id=self.new_id("rs"), content=[], status="in_progress"))
            events += [added, self._part_event("response.content_part.added", opened, ReasoningText(text=""))]
        current = self._open
        assert current is not None
        current.pieces.append(text)
        return events + [{"type": "response.reasoning_text.delta", "sequence_number": self._next(),
                          "item_id": current.id, "output_index": current.index, "content_index": 0, "delta": text}]

    def call(self, delta: ToolCallDelta) -> list[StreamEvent]:
        """A fragment of call `delta.index`: its first one (id, name) opens a `function_call` item."""
        events: list[StreamEvent] = []
        current = self._calls.get(delta.index)
        if current is None:
            events += self._close("completed")
            item = FunctionCall(id=self.new_id("fc"), call_id=delta.id or self.new_id("call"), name=delta.name or "",
                                arguments="", status="in_progress")
            current, added = self._add(item)
            self._calls[delta.index] = current
            events.append(added)
        elif delta.name and isinstance(current.item, FunctionCall) and not current.item.name:
            current.item.name = delta.name
        if delta.arguments:
            current.pieces.append(delta.arguments)
            events.append({"type": "response.function_call_arguments.delta", "sequence_number": self._next(),
                           "item_id": current.id, "output_index": current.index, "delta": delta.arguments})
        return events

    def finish(self, reason: str | None, usage: Mapping[str, int] | None = None) -> list[StreamEvent]:
        """The end: `response.completed`, or `response.incomplete` when the token limit cut it (`length`)."""
        if self.response.status in TERMINAL:
            return []
        events: list[StreamEvent] = []
        if not self.response.output:  # an answer with nothing else is still a message, if an empty one
            events += self._open_message()
            if self._space:
                events += self._text(self._space, self._space_logprobs)
        cut = reason == "length"
        events += self._close("incomplete" if cut else "completed")
        self.response.usage = usage_of(usage)
        if cut:
            self.response.status = "incomplete"
            self.response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
            return events + [self._response_event("response.incomplete")]
        self.response.status = "completed"
        self.response.completed_at = int(time.time())
        return events + [self._response_event("response.completed")]

    def fail(self, error: ErrorBody | Mapping[str, Any], status: int = 500) -> list[StreamEvent]:
        """`response.failed`: the job ended in an error (`status` is its HTTP status); what was written stays."""
        if self.response.status in TERMINAL:
            return []
        events = self._close("incomplete")
        self.response.status = "failed"
        self.response.error = error_of(error, status)
        return events + [self._response_event("response.failed")]

    def cancel(self) -> list[StreamEvent]:
        """Cancelled (`POST /responses/{id}/cancel`, or the client left): the open item ends incomplete.

        OpenAI has no stream event for it; the response object says `cancelled`."""
        if self.response.status in TERMINAL:
            return []
        events = self._close("incomplete")
        self.response.status = "cancelled"
        return events

    def error(self, error: ErrorBody) -> list[StreamEvent]:
        """An `error` event: for trouble that is not this response's failure (the stream could not go on)."""
        code = None if error.code is None else str(error.code)
        event: ErrorEvent = {"type": "error", "sequence_number": self._next(), "code": code, "message": error.message,
                             "param": error.param, "error": {"type": error.type, "code": code,
                                                             "message": error.message, "param": error.param}}
        return [event]

    def whole(self, parsed: Parsed, reason: str | None, usage: Mapping[str, int] | None = None,
              logprobs: list[dict[str, Any]] | None = None) -> Response:
        """A whole answer (`ChoiceState.parsed()`), through the same steps as a stream: the final response."""
        calls = [ToolCallDelta(i, call.id, call.name, call.arguments) for i, call in enumerate(parsed.tool_calls)]
        self.feed(ParsedDelta(parsed.content or "", parsed.reasoning or "", calls), logprobs)
        self.finish(reason, usage)
        return self.response

    def snapshot(self) -> Response:
        """The response as it stands, the item being written included (for a poll while it runs)."""
        response = self.response.model_copy(deep=True)
        if self._open is not None:
            _fill(response.output[self._open.index], self._open, self._open.item.status or "in_progress",
                  self._logprobs_out(self._open))
        return response

    # ---- items ----

    def _add(self, item: OutputMessage | FunctionCall | Reasoning) -> tuple[_Item, OutputItemEvent]:
        opened = _Item(item, len(self.response.output), item.id or "")
        self.response.output.append(item)
        self._open = opened
        return opened, self._item_event("response.output_item.added", opened)

    def _open_message(self) -> list[StreamEvent]:
        opened, added = self._add(OutputMessage(id=self.new_id("msg"), status="in_progress", content=[]))
        return [added, self._part_event("response.content_part.added", opened,
                                        OutputText(text="", logprobs=[] if self.top is not None else None))]

    def _text(self, text: str, entries: list[dict[str, Any]]) -> list[StreamEvent]:
        current = self._open
        assert current is not None
        current.pieces.append(text)
        current.logprobs += entries
        return [{"type": "response.output_text.delta", "sequence_number": self._next(), "item_id": current.id,
                 "output_index": current.index, "content_index": 0, "delta": text,
                 "logprobs": [_delta_logprob(e, self.top or 0) for e in entries] if entries else []}]

    def _close(self, status: str) -> list[StreamEvent]:
        current, self._open = self._open, None
        if current is None:
            return []
        out = self._logprobs_out(current)
        _fill(current.item, current, status, out)
        item = current.item
        if isinstance(item, OutputMessage):
            part = item.content[0]
            assert isinstance(part, OutputText)
            events: list[StreamEvent] = [
                {"type": "response.output_text.done", "sequence_number": self._next(), "item_id": current.id,
                 "output_index": current.index, "content_index": 0, "text": part.text,
                 "logprobs": [_delta_logprob(e, self.top or 0) for e in current.logprobs]},
                self._part_event("response.content_part.done", current, part)]
        elif isinstance(item, Reasoning):
            text = item.content[0] if item.content else ReasoningText(text="")
            events = [{"type": "response.reasoning_text.done", "sequence_number": self._next(),
                       "item_id": current.id, "output_index": current.index, "content_index": 0, "text": text.text},
                      self._part_event("response.content_part.done", current, text)]
        else:
            events = [{"type": "response.function_call_arguments.done", "sequence_number": self._next(),
                       "item_id": current.id, "output_index": current.index, "arguments": item.arguments}]
        return events + [self._item_event("response.output_item.done", current)]

    def _logprobs_out(self, current: _Item) -> list[Logprob] | None:
        if self.top is None:
            return None
        return [_output_logprob(e, self.top) for e in current.logprobs]

    def _entries(self, logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        if self.top is None or not logprobs:
            return []
        return [e for e in logprobs if e.get("logprob") is not None]

    # ---- events ----

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def _item_event(self, kind: str, current: _Item) -> OutputItemEvent:
        return {"type": kind, "sequence_number": self._next(), "output_index": current.index,
                "item": current.item.model_dump(by_alias=True)}

    def _part_event(self, kind: str, current: _Item, part: OutputText | ReasoningText) -> ContentPartEvent:
        return {"type": kind, "sequence_number": self._next(), "item_id": current.id, "output_index": current.index,
                "content_index": 0, "part": part.model_dump(by_alias=True)}

    def _response_event(self, kind: str) -> ResponseEvent:
        return {"type": kind, "sequence_number": self._next(), "response": self.snapshot().model_dump(by_alias=True)}


def _fill(item: Any, current: _Item, status: str, logprobs: list[Logprob] | None) -> None:
    text = "".join(current.pieces)
    item.status = status
    if isinstance(item, OutputMessage):
        item.content = [OutputText(text=text, logprobs=logprobs)]
    elif isinstance(item, Reasoning):
        item.content = [ReasoningText(text=text)]
    else:
        item.arguments = text


def _delta_logprob(entry: dict[str, Any], top: int) -> dict[str, Any]:
    token = {"token": entry["token"], "logprob": entry["logprob"],
             "bytes": entry.get("bytes") or list(entry["token"].encode())}
    return {**token, "top_logprobs": [token] if top >= 1 else []}


def _output_logprob(entry: dict[str, Any], top: int) -> Logprob:
    token = {"token": entry["token"], "bytes": entry.get("bytes") or list(entry["token"].encode()),
             "logprob": entry["logprob"]}
    return Logprob(**token, top_logprobs=[token] if top >= 1 else [])


# ---- SSE -----------------------------------------------------------------------------------------------------


def sse(event: StreamEvent, ids: bool = False) -> bytes:
    """One event as OpenAI sends it: `event: <type>` and `data: <json>` (and `id: <sequence_number>`)."""
    head = b"id: %d\n" % event["sequence_number"] if ids else b""
    return head + b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def render(events: Iterable[StreamEvent], after: int = -1, ids: bool = False) -> bytes:
    """Events as one SSE write; `after`: a resumed stream's last seen sequence number (only later ones go)."""
    return b"".join(sse(event, ids) for event in events if event["sequence_number"] > after)
