"""Background responses (`background: true`): they run whatever their client and their API process do.

Creating one queues its job as resumable (`Job.journal`, `Job.background`: the worker journals its events and
never cancels it for want of a listener), records the request (`Keys.background`) and answers at once with the
response `queued` (or, with `stream`, the stream of its events). From then on any API process can tell its
state: the journal (api/queue/journal.py) folded through the same `ResponseStream` as a live answer, with item
ids counted from the response's id, gives the same events with the same `sequence_number`s every time, which is
what lets a stream resume (`GET /responses/{id}?stream=true&starting_after=N`) on any API process.

The ended response is stored (store.py) by whoever sees its end first: the creating API process's keeper task, a
stream reading it, `GET` or `cancel`; the first also emits its webhook event (`response.completed`, ...:
common/webhooks/events.py). A response whose journal gains nothing for `background_stall_s` (no worker
took it, or Redis restarted without its events) ends `failed` with that reason, and its job is cancelled.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from starlette.requests import Request
from starlette.responses import Response

from api.http.auth import caller_of
from api.http.sse import DONE as END
from api.http.sse import PING, Last, SSEResponse
from api.openai.choices import ChoiceState
from api.openai.guidance import chat_plan
from api.openai.responses.chain import Chain, item_tokens
from api.openai.responses.convert import stored_items, to_chat
from api.openai.responses.events import TERMINAL, ResponseStream, counted_ids, initial_response, render
from api.openai.responses.protocol import Response as ResponseObject
from api.openai.responses.protocol import ResponsesRequest, StreamEvent
from api.openai.responses.store import ResponseStore, response_not_found
from api.openai.responses.turns import Turns
from api.openai.serving import add_usage, finish_choices
from api.queue.client import JobClient
from api.queue.journal import Journal, JournalBroken, paced
from api.queue.priority import LEVEL_TIERS
from api.queue.registry import Servable
from common.errors import OvqError
from common.events import ACCEPTED, CANCELLED, DELTA, DONE, ERROR, EventDict
from common.jobs import Job, JobHash, JobStatus
from common.keys import Keys
from common.owner import OWNER_FIELD, Caller
from common.redis.client import UNAVAILABLE
from common.webhooks.events import RESPONSE_EVENTS, Emitter

log = logging.getLogger("ovq.api.responses")
# The reply channel of background jobs: no API process subscribes to it or announces it (so no worker takes it for
# gone); every reader follows the job's journal instead.
REPLY_TO = "background"
CANCEL_WAIT_S = 5.0  # how long `cancel` waits for the worker's word before it records the response cancelled


@dataclass
class Background:
    """A background response as recorded at its creation (`Keys.background`)."""

    id: str
    body: ResponsesRequest
    job: str
    chain: Chain  # the responses before it it may still need (chain.py)
    prompt: str
    created_at: int
    logprobs: int | None
    owner: str | None  # whose it is (common/owner.py); None: recorded before owners were
    tier: str = "default"  # the service tier it is served at
    served: str = ""  # the servable's model (its tokenizer counts the items' tokens); "": the request's

    def fields(self) -> dict[str, Any]:
        return {"request": self.body.model_dump_json(), "job": self.job, "chain": orjson.dumps(self.chain.dumped()),
                "depth": self.chain.depth, "prompt": self.prompt, "created_at": self.created_at,
                "logprobs": "" if self.logprobs is None else self.logprobs, "model": self.body.model,
                **({OWNER_FIELD: self.owner} if self.owner is not None else {}), "tier": self.tier,
                "served": self.served or self.body.model}

    @classmethod
    def of(cls, response_id: str, fields: dict[bytes, bytes]) -> Background:
        top, owner = fields.get(b"logprobs", b""), fields.get(OWNER_FIELD.encode())
        depth = fields.get(b"depth")
        chain = Chain.of(orjson.loads(fields[b"chain"]), int(depth) if depth is not None else None)
        return cls(response_id, ResponsesRequest.model_validate_json(fields[b"request"]), fields[b"job"].decode(),
                   chain, fields[b"prompt"].decode(), int(fields[b"created_at"]),
                   int(top) if top else None, owner.decode() if owner is not None else None,
                   fields.get(b"tier", b"default").decode(), fields.get(b"served", b"").decode())


class Fold:
    """A background response's state, rebuilt from its job's events (in order, from the first)."""

    def __init__(self, record: Background, choice: ChoiceState, sampling: dict[str, float] | None = None) -> None:
        """`sampling`: the model's defaults (its card's), echoed where the request set none."""
        self.record = record
        response = initial_response(record.body, record.id, record.created_at, sampling, record.tier)
        self.state = ResponseStream(response, logprobs=record.logprobs, ids=counted_ids(record.id.split("_")[-1]))
        self.choice = choice
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.started = self.state.created()

    @property
    def response(self) -> ResponseObject:
        return self.state.response

    @property
    def ended(self) -> bool:
        return self.state.response.status in TERMINAL

    def feed(self, events: list[EventDict]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        state = self.state
        for event in events:
            kind = event["type"]
            if kind == ACCEPTED:
                if state.response.status != "in_progress":  # a second one: another worker took the job over
                    out += state.in_progress()
            elif kind == DELTA:
                out += state.feed(self.choice.feed(event), event.get("logprobs"))
            elif kind == DONE:
                add_usage(self.usage, event)
                finish_choices({(event["job"], 0): self.choice}, event)
                out += state.finish(self.choice.finish, self.usage)
            elif kind == ERROR:
                out += state.fail(event["error"], event["status"])
            elif kind == CANCELLED:
                out += state.cancel()
        return out


class BackgroundResponses:
    def __init__(self, jobs: JobClient, store: ResponseStore, turns: Turns) -> None:
        self.jobs, self.store, self.turns = jobs, store, turns
        self.redis: aioredis.Redis = jobs.redis
        self.keys: Keys = jobs.keys
        self.journal = Journal(self.redis, self.keys)
        self.settings = jobs.settings
        self.webhooks = Emitter(self.redis, self.keys, self.settings)  # its end's event, once whoever saves it
        self._keepers: set[asyncio.Task[None]] = set()

    # ---- creating one ----

    async def start(self, request: Request, body: ResponsesRequest, response_id: str, chain: Chain,
                    servable: Servable, job: Job) -> Response:
        """Record and queue the response's job; answer at once: the response `queued`, or its stream."""
        job.reply_to = REPLY_TO  # its journal is read, not its events: no API process parses them for nothing
        await self.jobs.detached(request, job)
        assert isinstance(job.prompt, str)
        record = Background(response_id, body, job.id, chain, job.prompt, int(time.time()), job.params.logprobs,
                            caller_of(request).tenant, LEVEL_TIERS[job.priority], servable.model)
        ttl, now = self.settings.journal_ttl_s, time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.background(response_id), mapping=record.fields())
        pipe.expire(self.keys.background(response_id), ttl)
        pipe.zadd(self.keys.backgrounds, {response_id: now})
        pipe.zremrangebyscore(self.keys.backgrounds, "-inf", now - ttl)
        pipe.expire(self.keys.backgrounds, ttl)
        await pipe.execute()
        await self.jobs.registry.enqueue(servable, job)
        request.state.record.request_id = job.id
        keeper = asyncio.ensure_future(self._keep(record, servable))
        self._keepers.add(keeper)
        keeper.add_done_callback(self._keepers.discard)
        headers = {"X-Request-Id": job.id}
        if body.stream:
            return SSEResponse(self._frames(request, record, self._fold(record, servable), -1), _nothing, headers)
        fold = self._fold(record, servable)
        return Response(orjson.dumps(fold.response.model_dump(by_alias=True)), media_type="application/json",
                        headers=headers)

    async def stop(self) -> None:
        for keeper in list(self._keepers):
            keeper.cancel()

    async def _keep(self, record: Background, servable: Servable) -> None:
        """Follow the job to its end and store the response (another API process does if this one dies first)."""
        fold = self._fold(record, servable)
        try:
            async for events in self.journal.follow(record.job, self.settings.background_stall_s, block=False,
                                                    model=record.body.model):
                fold.feed(events)
        except JournalBroken as exc:
            await self._broken(fold, exc)
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("following background response %s failed", record.id)
            return
        await self._save(fold)

    # ---- reading one, from any API process ----

    async def record(self, response_id: str, caller: Caller) -> Background | None:
        """The background response's record, when there is one the caller may see."""
        fields = await self.redis.hgetall(self.keys.background(response_id))
        return Background.of(response_id, fields) if fields and caller.sees(fields.get(OWNER_FIELD.encode())) \
            else None

    def _fold(self, record: Background, servable: Servable) -> Fold:
        plan = chat_plan(to_chat(record.body), servable.card)
        plan.opened(record.prompt)
        return Fold(record, ChoiceState(0, plan.parser(), record.logprobs), servable.card.sampling)

    async def _servable(self, record: Background) -> Servable:
        return await self.jobs.registry.servable(record.body.model)

    async def current(self, record: Background) -> Fold:
        """The response as its journal tells it now; an ended one is stored, a stalled one failed and stored."""
        fold = self._fold(record, await self._servable(record))
        try:
            events, last = await self.journal.read(record.job, record.body.model)
            fold.feed(events)
            if not fold.ended:
                seconds, _ = await self.redis.time()
                quiet = seconds - (last if last is not None else record.created_at)
                if quiet > self.settings.background_stall_s:
                    raise JournalBroken(f"No progress for {quiet:.0f}s (background_stall_s): the job was not taken "
                                        "by any worker, or its events were lost", "stalled")
        except JournalBroken as exc:
            await self._broken(fold, exc)
        if fold.ended:
            await self._save(fold)
        return fold

    async def retrieve(self, request: Request, response_id: str) -> Response:
        """`GET /responses/{id}`: stored, or folded from its journal; with `stream`, its events after
        `starting_after` (all of them without), then the rest as they come."""
        stream, caller = request.query_params.get("stream") in ("true", "1"), caller_of(request)
        if not stream:
            stored = await self.store.stored(response_id, caller)
            if stored is not None:
                return Response(stored, media_type="application/json")
        record = await self.record(response_id, caller)
        if record is None:
            if stream:
                raise OvqError(f"Response with id '{response_id}' is not a background response whose events are "
                               "still kept: only those can be streamed again", 404, code="not_found")
            raise response_not_found(response_id)
        if not stream:
            fold = await self.current(record)
            return Response(orjson.dumps(fold.response.model_dump(by_alias=True)), media_type="application/json")
        after = _starting_after(request.query_params.get("starting_after"))
        fold = self._fold(record, await self._servable(record))
        return SSEResponse(self._frames(request, record, fold, after), _nothing, {"X-Request-Id": record.job})

    async def cancel(self, response_id: str, caller: Caller) -> Response:
        """`POST /responses/{id}/cancel`: the job is cancelled at its worker (or before one takes it); the
        response as it ended. Cancelling one that ended already gives it as it is."""
        record = await self.record(response_id, caller)
        if record is None:
            stored = await self.store.stored(response_id, caller)
            if stored is None:
                raise response_not_found(response_id)
            if orjson.loads(stored).get("background"):
                return Response(stored, media_type="application/json")
            raise OvqError("Only responses created with background mode can be cancelled.", param="response_id",
                           code="invalid_request")
        fold = await self.current(record)
        if not fold.ended:
            await self.jobs.cancel([record.job], record.body.model)
            waited = time.monotonic()
            while not fold.ended and time.monotonic() - waited < CANCEL_WAIT_S:
                await asyncio.sleep(0.1)
                fold = await self.current(record)
            if not fold.ended:  # no worker has it (still queued): it is cancelled as it stands
                fold.state.cancel()
                await self._save(fold)
                await self.redis.hset(self.keys.job(record.job, record.body.model), JobHash.STATUS, JobStatus.CANCELLED)
        return Response(orjson.dumps(fold.response.model_dump(by_alias=True)), media_type="application/json")

    async def _frames(self, request: Request, record: Background, fold: Fold, after: int) -> AsyncIterator[bytes]:
        """The response's events after `after`, each with its `id:`; pings while it waits; ends with the last, and
        `data: [DONE]` (as the Open Responses spec ends a stream)."""
        yield render(fold.started, after, ids=True) or PING
        try:
            async for out in paced(self.journal, record.job, self.settings.background_stall_s,
                                   lambda events: render(fold.feed(events), after, ids=True), lambda: fold.ended,
                                   request.is_disconnected, model=record.body.model):
                if type(out) is Last:
                    await self._save(fold)
                    out = Last(out + END)
                yield out
        except JournalBroken as exc:
            out = await self._broken(fold, exc)
            yield Last(render(out, after, ids=True) + END)

    async def _broken(self, fold: Fold, exc: JournalBroken) -> list[StreamEvent]:
        """The journal cannot finish the response: it fails with why, and its job is cancelled."""
        log.warning("background response %s failed: %s", fold.record.id, exc)
        out = fold.state.fail(exc.body, exc.status)
        try:
            await self.jobs.cancel([fold.record.job], fold.record.body.model)
        except UNAVAILABLE:
            pass
        await self._save(fold)
        return out

    async def _save(self, fold: Fold) -> None:
        """Store the ended response, and add it to its conversation. Any API process may do this, more than once:
        the input items' ids are counted from the response's id (as its output items' are), so that a second save
        writes the same items, and the conversation takes them once (api/openai/conversations/store.py)."""
        response, body = fold.response, fold.record.body
        items = stored_items(body, response, input_ids(response.id))
        tokens = await item_tokens(self.settings, fold.record.served or body.model, items)
        try:
            await self.store.save(response, items, len(items) - len(response.output), fold.record.chain,
                                  fold.record.owner, tokens)
            await self.turns.append(body, response, input_ids(response.id), items)
            kind = RESPONSE_EVENTS.get(response.status or "")
            if kind is not None:  # stored first: a receiver that retrieves it on the event finds it
                await self.webhooks.once(kind, response.id, fold.record.owner)
        except UNAVAILABLE as exc:
            log.warning("background response %s not stored yet: Redis is unavailable (%s)", response.id, exc)


def input_ids(response_id: str) -> Callable[[str], str]:
    """Ids for a background response's input items, the same at every save: counted from its id, apart from its
    output items' (`counted_ids` of the id alone)."""
    return counted_ids(response_id.split("_")[-1] + "i")


def _starting_after(value: str | None) -> int:
    if value is None:
        return -1
    try:
        after = int(value)
    except ValueError:
        after = -2
    if after < -1:
        raise OvqError(f"Invalid 'starting_after': expected a sequence number, got '{value}'.",
                       param="starting_after", code="invalid_value")
    return after


async def _nothing() -> None:
    return None
