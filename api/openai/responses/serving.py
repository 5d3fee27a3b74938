"""`POST /responses` through the queue, whole or streamed, and the stored responses' routes.

A Responses request becomes the chat request it stands for (`convert.to_chat`, with its `previous_response_id`
chain's stored items as history) and then the chat path's own job (`Serving.chat_job`): same template, guided
generation, parsers, limits and queue. Only the answer differs: the worker's events go through a `ResponseStream`
(events.py), which writes the Responses stream events and the final `Response` from the same state.

A response ends `completed`, `incomplete` (the token limit: `max_output_tokens`), `failed` (an error after the
worker took it; a whole answer is then the HTTP error, as chat's is) or `cancelled` (the client left). With
`store` (the default) it is stored in Redis as it ended (store.py): any API process can retrieve, list, delete
and continue it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.http.auth import caller_of
from api.http.sse import DONE as END
from api.http.sse import PING, Last
from api.http.status import CLIENT_CLOSED
from api.openai.adapters import resolve
from api.openai.choices import ChoiceState
from api.openai.protocol import ChatCompletionRequest
from api.openai.responses.background import BackgroundResponses
from api.openai.responses.chain import Chain, item_tokens
from api.openai.responses.convert import random_id, stored_items, to_chat
from api.openai.responses.events import TERMINAL, ResponseStream, initial_response, new_id, render
from api.openai.responses.protocol import Response as ResponseObject
from api.openai.responses.protocol import ResponsesRequest, StreamEvent, not_supported
from api.openai.responses.store import MAX_LIST, History, ResponseStore
from api.openai.responses.truncation import Count, fit, room
from api.openai.responses.turns import Turns
from api.openai.serving import PING_S, REDIS_AWAY, Serving, add_usage, finish_choices, parse_body, stream_response
from api.openai.tokenize import TOKENIZERS
from api.ops.metrics import Record
from api.queue.client import ClientGone, Generation, error_of
from api.queue.priority import service_tier
from common.errors import OvqError
from common.events import CANCELLED, DELTA, DONE, ERROR, EventDict
from common.owner import Caller
from common.redis.client import UNAVAILABLE

log = logging.getLogger("ovq.api.responses")


# Chat's names for what a Responses request calls otherwise: an error names the field the client sent.
PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


# Chat's content part types, as a Responses request names them (in an error's message).
PART_TYPES = {"'image_url'": "'input_image'"}


def renamed(exc: OvqError) -> OvqError:
    """A chat-path error with its `param` as the Responses request names it (`messages[3].content` is `input`:
    the instructions and the chain's history shift the indexes), and the content part types it names."""
    param = exc.body.param
    head = param.split(".")[0].split("[")[0] if param else None
    if head in PARAMS:
        exc.body.param = PARAMS[head] + (param[len(head):] if head != "messages" else "")
        for chat, ours in PART_TYPES.items():
            exc.body.message = exc.body.message.replace(chat, ours)
    return exc


@dataclass(eq=False)
class Turn:
    """One response being generated: its request, its state, the chat choice it reads, the chain it continues."""

    body: ResponsesRequest
    state: ResponseStream
    choice: ChoiceState
    chain: Chain  # the responses before it it may still need (chain.py)
    owner: str  # whose it is (common/owner.py): the caller's tenant
    model: str  # the servable's model: its tokenizer counts the items' tokens when they are stored
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0,
                                                            "total_tokens": 0})
    saved: bool = False

    def read(self, event: EventDict, record: Record) -> list[StreamEvent]:
        """One worker event of a stream: what it adds to the response (a terminal event ends the generation)."""
        if event["type"] == DELTA:
            return self.state.feed(self.choice.feed(event), event.get("logprobs"))
        return self.end(event, record)

    def end(self, event: EventDict, record: Record) -> list[StreamEvent]:
        """A terminal event: `done` (usage, the finish reason), `error` (the response fails), `cancelled`."""
        kind = event["type"]
        if kind == DONE:
            add_usage(self.usage, event)
            record.done(event)
            finish_choices({(event["job"], 0): self.choice}, event)
        elif kind == ERROR:
            record.failed(event["status"], event["error"].get("code"))
            return self.state.fail(event["error"], event["status"])
        elif kind == CANCELLED:
            raise ClientGone()
        return []

    def finish(self, record: Record) -> list[StreamEvent]:
        calls = any(item.type == "function_call" for item in self.state.response.output)
        record.outcome = record.outcome or self.choice.finish_reason(calls) or "stop"
        return self.state.finish(self.choice.finish, self.usage)


class ResponsesServing:
    def __init__(self, serving: Serving, store: ResponseStore, turns: Turns) -> None:
        """`turns`: the conversations a response with `conversation` reads and extends."""
        self.serving, self.store, self.turns = serving, store, turns
        self.background = BackgroundResponses(serving.jobs, store, turns)

    async def create(self, request: Request) -> Response:
        body = await parse_body(request, ResponsesRequest)
        self.store.check_input(body)
        caller = caller_of(request)
        try:
            history, chat, _ = await self.history(body, caller)
            servable, job, plan = await self.serving.chat_job(request, chat)
        except OvqError as exc:
            raise renamed(exc) from None
        top = job.params.logprobs
        chain = history.chain.fitted(servable.card.context_length)
        if body.background:
            return await self.background.start(request, body, new_id("resp"), chain, servable, job)
        response = initial_response(body, sampling=servable.card.sampling, tier=service_tier(request))
        turn = Turn(body, ResponseStream(response, logprobs=top), ChoiceState(0, plan.parser(), top), chain,
                    caller.tenant, servable.model)
        record: Record = request.state.record
        try:
            async with self.serving.open(request, body.model, servable, [job]) as generation:
                headers = {"X-Request-Id": record.request_id}
                if body.stream:
                    frames = self._stream(generation, turn, record)
                    return stream_response(generation, frames, record, self.serving.metrics, headers,
                                           lambda: self._cancelled(turn))
                return await self._whole(generation, turn, record, headers)
        except ClientGone:
            await self._cancelled(turn)
            raise
        except OvqError as exc:  # the worker refused it (a prompt over the context, ...), or it failed
            raise renamed(exc) from None

    async def input_tokens(self, request: Request) -> JSONResponse:
        """`POST /responses/input_tokens`: the input tokens `create` would count for the same body (its
        `previous_response_id` chain included), without generating: the prompt rendered as for generation, then
        the model's own tokenizer on this API host (as `/tokenize`). Images' tokens only a worker knows: refused."""
        body = await parse_body(request, ResponsesRequest)
        try:
            _, chat, counted = await self.history(body, caller_of(request))
            if any(message.image_urls() for message in chat.messages):
                raise not_supported("input", "Counting the tokens of an input_image")
            if counted is None:
                counted = await self._count(chat)
        except OvqError as exc:
            raise renamed(exc) from None
        return JSONResponse({"object": "response.input_tokens", "input_tokens": counted})

    async def history(self, body: ResponsesRequest, caller: Caller) -> tuple[History, ChatCompletionRequest,
                                                                                int | None]:
        """The chain `body` continues and the chat request its prompt is: the items before its input (its
        `previous_response_id` chain's, or its conversation's, which makes no chain) then the input, or with
        `truncation: auto` the newest of them that fit (truncation.py), then also the prompt's token count."""
        auto = body.truncation == "auto" and bool(body.previous_response_id or body.conversation or body.input)
        if body.conversation is not None:
            items = await self.turns.history(body, caller)
            history = History(Chain(), items, [None] * len(items))
        elif body.previous_response_id:
            budget = room(body, await self.context(body.model)) if auto else None
            history = await self.store.history(body.previous_response_id, caller, budget)
        else:
            history = History(Chain())
        if not auto:
            return history, to_chat(body, history.items), None
        own = [item.model_dump(by_alias=True, exclude_none=True) for item in body.items()]
        bare = body.model_copy(update={"input": None})  # the input is in the conversation fitted
        items, counted = await fit(body, history.items + own, history.tokens + [None] * len(own), self._counter(bare))
        return history, to_chat(bare, items), counted

    async def context(self, model: str) -> int:
        """The context of the model a request names (adapters included)."""
        registry = self.serving.registry
        name, _ = await resolve(registry, model)
        return (await registry.servable(name)).card.context_length

    def _counter(self, body: ResponsesRequest) -> Count:
        """How a prompt of `body` after some history items is counted: rendered as for generation, then the
        model's own tokenizer on this API host (as `/tokenize`)."""
        settings = self.serving.jobs.settings

        async def count(items: list[dict[str, Any]]) -> tuple[int, int]:
            servable, _, prompt = await self.serving.chat_prompt(to_chat(body, items))
            return await asyncio.to_thread(TOKENIZERS.count, settings, servable.model, prompt), \
                servable.card.context_length
        return count

    async def _count(self, chat: ChatCompletionRequest) -> int:
        """The prompt tokens of a chat request, as `_counter` counts them."""
        servable, _, prompt = await self.serving.chat_prompt(chat)
        return await asyncio.to_thread(TOKENIZERS.count, self.serving.jobs.settings, servable.model, prompt)

    async def _whole(self, generation: Generation, turn: Turn, record: Record, headers: dict[str, str]) -> Response:
        response = await self._complete(generation, turn, record)
        return Response(orjson.dumps(response.model_dump(by_alias=True)), media_type="application/json",
                        headers=headers)

    async def generate(self, request: Request, body: ResponsesRequest, chat: ChatCompletionRequest) -> ResponseObject:
        """A whole response to `body` whose prompt is `chat` (`history`'s), through the queue as any: what a
        compaction's summary is (compact.py). Stored when `body` says so."""
        servable, job, plan = await self.serving.chat_job(request, chat)
        response = initial_response(body, sampling=servable.card.sampling, tier=service_tier(request))
        turn = Turn(body, ResponseStream(response), ChoiceState(0, plan.parser(), None), Chain(),
                    caller_of(request).tenant, servable.model)
        async with self.serving.open(request, body.model, servable, [job]) as generation:
            return await self._complete(generation, turn, request.state.record)

    async def _complete(self, generation: Generation, turn: Turn, record: Record) -> ResponseObject:
        choice = turn.choice
        try:
            while not generation.finished:
                for event in await generation.events():
                    if event["type"] == DELTA:
                        choice.add(event)
                    elif event["type"] == ERROR:
                        raise error_of(event, "server_error")
                    else:
                        turn.end(event, record)
        except OvqError as exc:  # the HTTP error, as chat's; stored as the failed response it was
            turn.state.fail(exc.body, exc.status)
            await self._save(turn, quiet=True)
            raise
        parsed = choice.parsed()
        record.outcome = choice.finish_reason(bool(parsed.tool_calls)) or "stop"
        response = turn.state.whole(parsed, choice.finish, turn.usage, choice.logprobs)
        await self._save(turn)
        return response

    async def _stream(self, generation: Generation, turn: Turn, record: Record) -> AsyncIterator[bytes]:
        """Stream events as SSE, one write per wake-up (everything that arrived meanwhile), then `data: [DONE]`: the
        Open Responses spec ends a stream with it (OpenAI does not; its SDKs stop there). The response is stored
        before its last event goes out, so a client that reads `response.completed` finds it stored."""
        yield render(turn.state.start())
        last = time.monotonic()
        pending: list[StreamEvent] = []
        try:
            while not generation.finished:
                events = await generation.events()
                for event in events:
                    pending += turn.read(event, record)
                    if event["type"] == ERROR:
                        generation.end()  # the response ends here
                        break
                if generation.finished:
                    break
                now = time.monotonic()
                if pending:
                    last = now
                    yield render(pending)
                    pending = []
                elif now - max(last, generation.inbox.last) >= PING_S:  # idle: keep proxies open
                    last = now
                    yield PING
            pending += turn.finish(record)
        except OvqError as exc:
            record.failed(exc.status, exc.body.code)
            pending += turn.state.fail(exc.body, exc.status)
        except UNAVAILABLE:
            record.failed(503)
            pending += turn.state.fail(REDIS_AWAY.body, 503)
        except ClientGone:
            record.failed(CLIENT_CLOSED)
            return  # stored as cancelled when the stream closes
        if not await self._save(turn, quiet=True):
            pending += turn.state.error(REDIS_AWAY.body)
        yield Last(render(pending) + END)

    async def _save(self, turn: Turn, quiet: bool = False) -> bool:
        """Store the response as it ended (with `store`), and add it to its conversation (with `conversation`: the
        same items, the same ids). `quiet`: Redis being away is logged, not raised."""
        if turn.saved or not (turn.body.store or turn.body.conversation):
            return True
        turn.saved = True
        response = turn.state.response
        items = stored_items(turn.body, response)
        tokens = await item_tokens(self.serving.jobs.settings, turn.model, items) if turn.body.store else []
        stored = True
        try:
            if turn.body.store:
                stored = await self.store.save(response, items, len(items) - len(response.output), turn.chain,
                                               turn.owner, tokens)
            await self.turns.append(turn.body, response, random_id, items)
        except UNAVAILABLE as exc:
            if not quiet:
                raise
            log.warning("response %s not stored: Redis is unavailable (%s)", response.id, exc)
            return False
        if not stored:
            response.store = False  # over responses_max_bytes: say so, where the answer has not gone out yet
        return True

    async def _cancelled(self, turn: Turn) -> None:
        """The client left before the response ended: it is stored as `cancelled`, with what it had."""
        if turn.state.response.status in TERMINAL:
            return
        turn.state.cancel()
        await self._save(turn, quiet=True)


# ---- stored responses ------------------------------------------------------------------------------------------

router = APIRouter()


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses.store


def _background(request: Request) -> BackgroundResponses:
    return request.app.state.responses.background


@router.post("/responses/input_tokens")
async def input_tokens(request: Request) -> JSONResponse:
    return await request.app.state.responses.input_tokens(request)


@router.get("/responses/{response_id}")
async def retrieve(request: Request, response_id: str) -> Response:
    """Stored, or (a background response) as its journal tells it now; `stream`: its events again."""
    return await _background(request).retrieve(request, response_id)


@router.post("/responses/{response_id}/cancel")
async def cancel(request: Request, response_id: str) -> Response:
    return await _background(request).cancel(response_id, caller_of(request))


@router.delete("/responses/{response_id}")
async def delete(request: Request, response_id: str) -> JSONResponse:
    await _store(request).delete(response_id, caller_of(request))
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/responses/{response_id}/input_items")
async def input_items(request: Request, response_id: str) -> JSONResponse:
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise OvqError(f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.", param="order",
                       code="invalid_value")
    limit = page_limit(query.get("limit"))
    return JSONResponse(await _store(request).input_items(response_id, caller_of(request), limit, order,
                                                          query.get("after")))


def page_limit(value: Any) -> int:
    if value is None:
        return 20
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST:
        raise OvqError(f"Invalid 'limit': expected an integer between 1 and {MAX_LIST}, got '{value}'.",
                       param="limit", code="invalid_value")
    return limit
