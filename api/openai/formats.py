"""How an answer looks on the wire: chat or text completion, whole or as SSE frames, any number of choices.

Stream chunks are rendered from templates made once per response (the id, model and creation time never
change), with orjson for the text: a streamed token costs a few string joins, not a model object. The shapes are
the OpenAI ones that `api/openai/protocol.py` models (`ChatCompletionChunk`, `Completion`; tests check every
frame against them): a delta carries only the fields it has (`{"content": "…"}`), the finishing chunk has an
empty delta and the finish reason, `reasoning_content` appears only for models with a reasoning parser, and
`usage` only when the client asked for it (`stream_options.include_usage`: null on every chunk, the totals on a
last chunk of its own; with vLLM's `continuous_usage_stats` every chunk carries the usage so far).
"""
from __future__ import annotations

import time
from typing import Any

import orjson

from api.openai.choices import ChoiceState
from api.openai.parsers import ParsedDelta, ToolCall
from api.openai.protocol import ChatCompletion, Completion
from common.events import DeltaEvent, TokenLogprobDict


def _chat_logprobs(entries: list[TokenLogprobDict], top: int) -> dict[str, Any]:
    content = []
    for entry in entries:
        if entry["logprob"] is None:
            continue
        token = {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}
        content.append({**token, "top_logprobs": [token] if top >= 1 else []})
    return {"content": content}


def _completion_logprobs(entries: list[TokenLogprobDict], choice: ChoiceState) -> dict[str, Any]:
    """`logprobs: 0` and `1` look alike, as in vLLM: each token's alternatives hold the sampled token itself."""
    tokens, logprobs, offsets = [], [], []
    alternatives: list[dict[str, float] | None] = []
    for entry in entries:
        tokens.append(entry["token"])
        logprobs.append(entry["logprob"])
        offsets.append(choice.offset)
        choice.offset += len(entry["token"])
        alternatives.append(None if entry["logprob"] is None else {entry["token"]: entry["logprob"]})
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": alternatives, "text_offset": offsets}


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _usage(usage: dict[str, int]) -> bytes:
    return orjson.dumps({"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                         "total_tokens": usage["total_tokens"]})


class _Stream:
    """Frame templates of one streamed response."""

    object = ""

    def __init__(self, id: str, model: str, include_usage: bool = False, continuous_usage: bool = False,
                 tier: str | None = None) -> None:
        """`tier`: the service tier the answer is served at, echoed on every chunk (chat's; None: not shown)."""
        self.id, self.model, self.created, self.include_usage = id, model, int(time.time()), include_usage
        self.tier = tier
        shown = b',"service_tier":' + orjson.dumps(tier) if tier is not None else b""
        self._head = (b'data: {"id":' + orjson.dumps(id) + b',"object":"' + self.object.encode() + b'","created":'
                      + str(self.created).encode() + b',"model":' + orjson.dumps(model) + shown + b',"choices":[')
        self._tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
        # The usage so far, when every chunk carries it (`started` sets the prompt's, `count` adds each delta's).
        self.running: dict[str, int] | None = None
        if include_usage and continuous_usage:
            self.running = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

    def started(self, prompt_tokens: int) -> None:
        if self.running is not None:
            self.running.update(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)

    def count(self, delta: dict[str, Any]) -> None:
        if self.running is not None and delta.get("tokens"):
            self.running["completion_tokens"] += delta["tokens"]
            self.running["total_tokens"] += delta["tokens"]

    def _frame(self, choice: bytes) -> bytes:
        if self.running is not None:
            return self._head + choice + b'],"usage":' + _usage(self.running) + b"}\n\n"
        return self._head + choice + self._tail

    def usage(self, usage: dict[str, int]) -> bytes:
        return self._head + b'],"usage":' + _usage(usage) + b"}\n\n"


class ChatFormat(_Stream):
    object = "chat.completion.chunk"

    def __init__(self, id: str, model: str, include_usage: bool = False, reasoning: bool = False,
                 continuous_usage: bool = False, tier: str = "default") -> None:
        super().__init__(id, model, include_usage, continuous_usage, tier)
        self.reasoning = reasoning

    def first(self, choices: list[ChoiceState]) -> bytes:
        """The role chunk of every choice, as OpenAI opens a chat stream."""
        return b"".join(self._frame(b'{"index":%d,"delta":{"role":"assistant","content":""},"logprobs":null,'
                                    b'"finish_reason":null}' % c.index) for c in choices)

    def plain(self, choice: ChoiceState, text: str, finish: str | None) -> bytes:
        """The usual case (no parser, no log-probabilities): the text as it came, then the finish."""
        if finish:
            choice.finish = finish
        out = self._content(choice.index, text) if text else b""
        return out + self._finish(choice.index, finish, b"null") if finish else out

    def chunk(self, choice: ChoiceState, delta: DeltaEvent) -> bytes:
        finish = delta.get("finish_reason")
        if choice.plain:
            return self.plain(choice, delta["text"], finish)
        parsed = choice.feed(delta)
        logprobs = None
        if choice.top is not None and delta.get("logprobs"):
            logprobs = _chat_logprobs(delta["logprobs"], choice.top)
        out = b""
        if parsed or logprobs is not None:
            body = {"index": choice.index, "delta": self._delta(parsed), "logprobs": logprobs, "finish_reason": None}
            out = self._frame(orjson.dumps(body))
        if finish:
            out += self._finish(choice.index, choice.finish_reason(choice.called), b"null")
        return out

    def _content(self, index: int, text: str) -> bytes:
        return self._frame(b'{"index":%d,"delta":{"content":%s},"logprobs":null,"finish_reason":null}'
                           % (index, orjson.dumps(text)))

    def _finish(self, index: int, reason: str | None, logprobs: bytes) -> bytes:
        return self._frame(b'{"index":%d,"delta":{},"logprobs":%s,"finish_reason":%s}'
                           % (index, logprobs, orjson.dumps(reason)))

    def _delta(self, parsed: ParsedDelta) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if parsed.content:
            delta["content"] = parsed.content
        if parsed.reasoning and self.reasoning:
            delta["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            delta["tool_calls"] = [
                {"index": c.index, **({"id": c.id, "type": "function"} if c.id else {}),
                 "function": {k: v for k, v in (("name", c.name), ("arguments", c.arguments)) if v is not None}}
                for c in parsed.tool_calls]
        return delta

    def whole(self, choices: list[ChoiceState], usage: dict[str, int]) -> bytes:
        out = []
        for choice in choices:
            parsed = choice.parsed()
            message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if self.reasoning:
                message["reasoning_content"] = parsed.reasoning
            if parsed.tool_calls:
                message["tool_calls"] = _tool_calls(parsed.tool_calls)
            logprobs = _chat_logprobs(choice.logprobs, choice.top) if choice.top is not None else None
            out.append({"index": choice.index, "message": message, "logprobs": logprobs,
                        "finish_reason": choice.finish_reason(bool(parsed.tool_calls))})
        return orjson.dumps({"id": self.id, "object": ChatCompletion.model_fields["object"].default,
                             "created": self.created, "model": self.model, "service_tier": self.tier,
                             "choices": out, "usage": usage})


class CompletionFormat(_Stream):
    object = "text_completion"

    def first(self, choices: list[ChoiceState]) -> bytes:
        return b""  # a text completion stream has no role chunk

    def plain(self, choice: ChoiceState, text: str, finish: str | None) -> bytes:
        if finish:
            choice.finish = finish
        if not text and not finish:
            return b""
        return self._frame(b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":%s}'
                           % (choice.index, orjson.dumps(text), orjson.dumps(finish)))

    def chunk(self, choice: ChoiceState, delta: DeltaEvent) -> bytes:
        finish = delta.get("finish_reason")
        if choice.plain:
            return self.plain(choice, delta["text"], finish)
        if finish:
            choice.finish = finish
        logprobs = None
        if choice.top is not None and delta.get("logprobs"):
            logprobs = _completion_logprobs(delta["logprobs"], choice)
        if not delta["text"] and logprobs is None and not finish:
            return b""
        body = {"index": choice.index, "text": delta["text"], "logprobs": logprobs, "finish_reason": finish}
        return self._frame(orjson.dumps(body))

    def whole(self, choices: list[ChoiceState], usage: dict[str, int]) -> bytes:
        out = []
        for choice in choices:
            logprobs = _completion_logprobs(choice.logprobs, choice) if choice.top is not None else None
            out.append({"index": choice.index, "text": "".join(choice.text), "logprobs": logprobs,
                        "finish_reason": choice.finish})
        return orjson.dumps({"id": self.id, "object": Completion.model_fields["object"].default,
                             "created": self.created, "model": self.model, "choices": out, "usage": usage})


Format = ChatFormat | CompletionFormat
