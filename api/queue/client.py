"""A response's jobs seen from the API: enqueue them, hold the HTTP status until every worker's verdict, follow
their events, cancel what is left when the client goes or a bound is reached.

Every wait has a bound: a job no worker starts within `queue_timeout_s` of the request's start is a 503 (it waits
that long also when no worker is live: one restarting, or scaled to zero), and is taken back out of its stream; a
running job whose worker's heartbeat is gone waits for another worker to continue it (that worker sends the job's
`accepted` again; OVQ_WORKER_TAKEOVER) and is a 500 if none has within `queue_timeout_s`; a request past its
deadline (`X-Request-Timeout`) is a 504; losing the event hub's subscription (Redis away) ends the response with a
503. The client leaving cancels its jobs at their workers.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis.asyncio as aioredis
from starlette.requests import Request

from api.http.auth import caller_of
from api.http.sse import Write
from api.ops.metrics import Metrics, Record
from api.queue.hub import EventHub, Express, Inbox
from api.queue.priority import priority_of
from api.queue.registry import Queued, Registry, Servable
from api.queue.tenant import Tenant, scheduled_tenant
from common.errors import OvqError, unavailable
from common.events import ACCEPTED, CANCELLED, ERROR, TERMINAL, AcceptedEvent, ErrorEvent, EventDict
from common.fairness import estimate_cost
from common.jobs import Job, JobHash, JobStatus, Share
from common.keys import Keys
from common.redis.client import UNAVAILABLE, redis_away
from common.settings import Settings

log = logging.getLogger("ovq.api.jobs")
QUEUED = JobStatus.QUEUED.encode()


READ_TIMEOUT = "x-stainless-read-timeout"
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class ClientGone(Exception):
    """The client left (or its jobs were cancelled): the route answers 499 to nobody, a stream just ends."""


def error_of(event: ErrorEvent, default_type: str) -> OvqError:
    """A worker's `error` event as the HTTP error it stands for."""
    error = event["error"]
    return OvqError(error["message"], event["status"], error.get("type", default_type), error.get("param"),
                    error.get("code"))


def request_id(request: Request) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one: it names the job(s) everywhere."""
    given = request.headers.get("x-request-id", "")
    return given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def deadline(request: Request, default_s: float | None) -> float | None:
    """`X-Request-Timeout` (seconds), else the server's `request_timeout_s`: when the request must be done."""
    given = request.headers.get("x-request-timeout")
    try:
        seconds = float(given) if given is not None else default_s
    except ValueError:
        raise OvqError("X-Request-Timeout must be a number of seconds", param="X-Request-Timeout") from None
    if seconds is None:
        return None
    if not seconds > 0:
        raise OvqError("X-Request-Timeout must be positive", param="X-Request-Timeout")
    return time.monotonic() + seconds


def read_timeout(request: Request) -> float | None:
    """The openai SDK's read timeout (`X-Stainless-Read-Timeout`, on every request it sends) as time.monotonic():
    how long it waits for the first byte of a stream, or for a unary request's whole answer. It only stands in
    for a deadline when no `X-Request-Timeout` is given; an unreadable one is ignored (nobody set it by hand)."""
    if "x-request-timeout" in request.headers:
        return None
    try:
        seconds = float(request.headers.get(READ_TIMEOUT, ""))
    except ValueError:
        return None
    return time.monotonic() + seconds if seconds > 0 else None


def unix(monotonic: float | None) -> float | None:
    """A time.monotonic() instant as unix s: what a worker on another host can compare with its clock."""
    return None if monotonic is None else time.time() + (monotonic - time.monotonic())


class JobClient:
    def __init__(self, redis: aioredis.Redis, keys: Keys, hub: EventHub, registry: Registry, settings: Settings,
                 metrics: Metrics) -> None:
        self.redis, self.keys, self.hub, self.registry, self.settings = redis, keys, hub, registry, settings
        self.metrics = metrics

    def open(self, request: Request, jobs: list[Job], servable: Servable, deadline: float | None,
             stream: bool = False) -> Generation:
        """The response's jobs, to run with `async with`: entering queues them, watches the client and holds until
        every worker's verdict (its refusal raises as the HTTP error, also for streams); leaving cancels whatever
        has not ended, unless a stream took the generation over (`hand_over()`): then the stream's end closes it.
        The client leaving at any point raises `ClientGone`.

        A `stream` whose jobs found no live worker does not hold: it enters at once (`waiting`), so its headers
        and keep-alives go out while it waits for a worker (`starting()`), and a refusal becomes an SSE error."""
        record: Record = request.state.record
        record.request_id = jobs[0].id.rsplit("-", 1)[0] if len(jobs) > 1 else jobs[0].id
        priority = priority_of(request)
        first_byte = read_from_sdk = read_timeout(request)
        if first_byte is not None and not stream:  # a unary answer's first byte is all of it
            deadline, first_byte = min(deadline or first_byte, first_byte), None
        generation = Generation(self, jobs, servable, deadline, request)
        generation.first_byte = first_byte
        generation.bound_by = ("X-Request-Timeout" if "x-request-timeout" in request.headers
                               else "X-Stainless-Read-Timeout" if read_from_sdk is not None
                               else "request_timeout_s")
        tenant = scheduled_tenant(request, priority)
        generation.tenant = tenant
        generation.owner = caller_of(request).tenant
        for job in jobs:
            job.priority = priority
            job.deadline, job.start_by = unix(deadline), unix(generation.start_by)
            if tenant is not None and self.settings.fairness:
                job.share = Share(tenant=tenant.name, weight=tenant.weight, cost=estimate_cost(job))
        generation.started = record.started  # one bound on the wait for a worker, card included (Registry)
        generation.holds = not stream
        return generation

    async def detached(self, request: Request, job: Job) -> None:
        """Schedule a job no request waits on (a background response, a video): the request's priority, its
        tenant's fair share and quota, as for any job; journaled, and run whatever its client does."""
        job.journal = job.background = True
        job.priority = priority_of(request)
        tenant = scheduled_tenant(request, job.priority)
        if tenant is None:
            return
        if self.settings.fairness:
            job.share = Share(tenant=tenant.name, weight=tenant.weight, cost=estimate_cost(job))
        try:
            await self.registry.quotas.take(tenant, estimate_cost(job))
        except OvqError:
            self.metrics.refused(job.model, "quota")
            raise

    async def cancel(self, job_ids: list[str], model: str = "") -> None:
        """`model`: the jobs' (one response's jobs share it), which names their keys on a Cluster."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.set(self.keys.cancel(job_id, model), 1, ex=self.settings.cancel_ttl_s)
            if self.keys.cluster:  # sharded: to the model's workers' node only
                pipe.spublish(self.keys.model_cancel_channel(model), job_id)
            else:
                pipe.publish(self.keys.cancel_channel, job_id)
        await pipe.execute()

    async def statuses(self, job_ids: list[str], model: str = "") -> list[bytes | None]:
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job(job_id, model), JobHash.STATUS)
        return await pipe.execute()

    async def workers_alive(self, workers: list[str]) -> list[bool]:
        pipe = self.redis.pipeline(transaction=False)
        for worker in workers:
            pipe.exists(self.keys.worker(worker))
        return [bool(n) for n in await pipe.execute()]


class Generation:
    """The jobs of one response, submitted together and followed through one inbox; each ends in exactly one
    terminal event, and `close()` cancels whichever have not. Run with `async with` (see `JobClient.open`)."""

    def __init__(self, client: JobClient, jobs: list[Job], servable: Servable, deadline: float | None,
                 request: Request | None = None) -> None:
        self.client, self.jobs, self.servable, self.request = client, jobs, servable, request
        self.inbox = Inbox()
        self.open = {job.id for job in jobs}  # not ended yet
        self.accepted: dict[str, AcceptedEvent] = {}
        self.deadline = deadline  # time.monotonic() by which the whole response must be done
        self.first_byte: float | None = None  # time.monotonic() by which a stream's jobs must have started
        self.bound_by = "X-Request-Timeout"  # what set the deadline, for the client's error message
        self.started = time.monotonic()
        self.gone = False
        self.ended = False
        self._held: list[EventDict] = []
        self._checked = self.started
        self._write: Write | None = None  # a stream's synchronous frame write to its client, when its server has one
        self._watcher: asyncio.Task[None] | None = None
        self._submitted: list[str] = []
        self._queued: dict[str, Queued] = {}
        self.holds = True  # entering waits for every `accepted`; a stream with no live worker waits after
        self._handed_over = False  # to a stream: its end closes the generation
        self._orphaned_since: float | None = None  # when a job's worker was found dead (none continues it yet)
        self.detached = False  # a resumable stream's: closing it does not cancel its jobs (their lease lapses)
        self.tenant: Tenant | None = None  # whose work it is: fair shares and quota (api/queue/tenant.py)
        self.owner: str | None = None  # whose it is: who may resume it (common/owner.py)

    async def __aenter__(self) -> Generation:
        trace = self.request.state.record.trace if self.request is not None else None
        if trace is not None:  # tracing is on: the jobs carry the request's span, its phases are marked
            trace.mark("validated")
            for job in self.jobs:
                job.traceparent = trace.traceparent
        await self.refuse_late()
        await self.submit()
        if self.request is not None:
            self.request.state.record.device = self.job.device
            self.watch(self.request)
        if trace is not None:
            trace.mark("enqueued")
        if not self.holds and self.waiting:
            return self
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        if trace is not None:
            trace.mark("accepted")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._handed_over:
            await self.close()

    def hand_over(self) -> None:
        """A stream takes the generation over: leaving the `async with` no longer closes it, the stream's end does."""
        self._handed_over = True

    @property
    def job(self) -> Job:
        return self.jobs[0]

    @property
    def start_by(self) -> float | None:
        """time.monotonic() after which starting the jobs is no use: the earlier of the two deadlines."""
        bounds = [t for t in (self.deadline, self.first_byte) if t is not None]
        return min(bounds) if bounds else None

    @property
    def waiting(self) -> bool:
        """Some job went in with no live worker to take it (one restarting, or none yet): it waits for one."""
        return any(not queued.live for queued in self._queued.values()) and self.pending

    @property
    def pending(self) -> bool:
        """Not every job has its `accepted` yet."""
        return len(self.accepted) < len(self.jobs)

    @property
    def finished(self) -> bool:
        return self.ended or not self.open

    def writes_to(self, write: Write) -> None:
        self._write = write

    @contextmanager
    def express(self, lane: Callable[[Write], Express | None]) -> Iterator[None]:
        """While inside: the hub hands each event to `lane(write)` at once, from its own callback, where the
        stream's server can write to the client directly (`writes_to`); the lane may decline an event, which is
        then queued for `events()` as always. Leaving removes it: nothing may follow a stream's last frames."""
        if self._write is not None:
            self.inbox.express = lane(self._write)
        try:
            yield
        finally:
            self.inbox.express = None

    @property
    def quiet(self) -> bool:
        """No event held back from `start()` and the client still there: an event may be handled at once."""
        return not self._held and not self.gone

    def end(self) -> None:
        """The response ends now (one of its jobs failed): `close()` cancels the others."""
        self.ended = True

    async def submit(self) -> None:
        """Enqueue every job (registered first: a first event may come at once); a refusal undoes the rest."""
        hub = self.client.hub
        self.inbox.channel = hub.channel(self.job.model)
        if not await hub.listen(self.job.model):  # a new model's channel (a Cluster's): heard before it is queued
            raise redis_away()
        if self.tenant is not None and self.tenant.tokens_per_min is not None:
            try:
                await self.client.registry.quotas.take(self.tenant, sum(estimate_cost(job) for job in self.jobs))
            except OvqError:
                self.client.metrics.refused(self.job.model, "quota")
                raise
        try:
            for job in self.jobs:
                hub.register(job.id, self.inbox)
                self._queued[job.id] = await self.client.registry.enqueue(self.servable, job, self.owner)
                self._submitted.append(job.id)
        except OvqError as error:
            if error.body.code == "queue_full":
                self.client.metrics.refused(self.job.model, "queue_full", self.servable.card.device)
            await self.close()
            raise
        except BaseException:
            await self.close()
            raise

    async def refuse_late(self) -> None:
        """429 at once for jobs the queue cannot start before their deadline by its current wait estimate: the
        client learns now, not when the deadline has passed, and no worker runs them for nobody."""
        start_by = self.start_by
        if start_by is None:
            return
        left = start_by - time.monotonic()
        share = self.job.share
        wait = await self.client.registry.wait_estimate(self.servable, self.job.priority,
                                                        share.tenant if share is not None else None)
        if wait is None or wait <= left:
            return
        self.client.metrics.refused(self.job.model, "deadline", self.servable.card.device)
        error = OvqError(f"The queue of `{self.job.model}` cannot start this request within its deadline "
                         f"({self.bound_by}: {max(left, 0):.1f}s left); the estimated wait is {wait:.1f}s", 429,
                         "rate_limit_error", code="deadline_unreachable")
        error.retry_after = max(1, math.ceil(wait - max(left, 0)))
        raise error

    def watch(self, request: Request) -> None:
        """Notice the client leaving (its body must have been read): the waits below then raise ClientGone."""
        async def wait() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.gone = True
            self.inbox.wake()

        self._watcher = asyncio.ensure_future(wait())

    async def start(self) -> None:
        """Wait for every job's `accepted`; a worker's refusal becomes the HTTP error (also for streams)."""
        while not await self.starting():
            pass

    async def starting(self) -> bool:
        """One step of `start()` (the events that came, or a tick with none): whether every job is accepted."""
        while self.pending:
            events = await self._take(tick=True)
            if not events:
                return False
            for event in events:
                kind = event["type"]
                if kind == ACCEPTED:
                    self.accepted[event["job"]] = event
                elif kind == ERROR:
                    self.open.discard(event["job"])
                    raise error_of(event, "invalid_request_error")
                elif kind == CANCELLED:
                    self.open.discard(event["job"])
                    raise ClientGone()
                else:
                    self._held.append(event)
        return True

    async def events(self) -> list[EventDict]:
        """The next events after `accepted` (terminal ones close their job); [] when a tick passed with none."""
        if self._held:
            events, self._held = self._held, []
        else:
            events = await self._take(tick=True)
        return self._seen(events)

    def _seen(self, events: list[EventDict]) -> list[EventDict]:
        accepted = False
        for event in events:
            kind = event["type"]
            if kind in TERMINAL:
                self.open.discard(event["job"])
            elif kind == ACCEPTED:  # again: another worker continues a job whose worker died
                self.accepted[event["job"]] = event  # type: ignore[assignment]
                accepted = True
        if not accepted:
            return events
        self._orphaned_since = None
        return [e for e in events if e["type"] != ACCEPTED]

    async def _take(self, tick: bool = False) -> list[EventDict]:
        while True:
            if self.gone:
                raise ClientGone()
            events = await self.inbox.take()
            if self.gone:
                raise ClientGone()
            if events:
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise OvqError("The request did not finish before its deadline (X-Request-Timeout)", 504,
                                   "timeout", code="deadline_exceeded")
                return events
            await self._check()
            if tick:
                return []

    async def _check(self) -> None:
        """A tick with no event: enforce the bounds on this response's waits."""
        if self.inbox.lost and not await self._survived():
            raise redis_away()
        try:
            await self._bounds()
        except OvqError:
            await self._leave_queue()
            raise

    async def _leave_queue(self) -> None:
        """A bound ends the response: its jobs no worker took leave their stream now, before the error is written.
        A stream's error event goes out ahead of `close()`, and a client that read it must find nothing of its
        request left to run (a worker that came up meanwhile would run it for nobody)."""
        if self.detached:
            return
        waiting = [j for j in self._submitted if j in self.open and j not in self.accepted]
        if not waiting:
            return
        try:
            await asyncio.shield(self._withdraw(waiting))
        except UNAVAILABLE:
            return  # `close()` tries again, and says so when it cannot
        self.open.difference_update(waiting)

    async def _bounds(self) -> None:
        settings, now = self.client.settings, time.monotonic()
        if self.deadline is not None and now > self.deadline:
            raise OvqError("The request did not finish before its deadline (X-Request-Timeout)", 504, "timeout",
                           code="deadline_exceeded")
        if self.first_byte is not None and self.pending and now > self.first_byte:
            raise OvqError("The request did not start before its client's read timeout (X-Stainless-Read-Timeout)",
                           504, "timeout", code="deadline_exceeded")
        if len(self.accepted) < len(self.jobs) and now - self.started > settings.queue_timeout_s:
            raise unavailable(f"No worker of `{self.job.model}` started this request within "
                              f"{settings.queue_timeout_s:.0f}s (queue_timeout_s)")
        check = settings.first_event_check_s
        if now - self._checked >= check and now - self.inbox.last >= check:
            self._checked = now
            running = [self.accepted[j]["worker"] for j in self.open if j in self.accepted]
            try:
                alive = all(await self.client.workers_alive(running)) if running else True
            except UNAVAILABLE:
                alive = True  # Redis is away: the hub's lost subscription decides
            if alive:
                self._orphaned_since = None
            elif not settings.worker_takeover:
                raise OvqError("The worker running this request died mid-generation", 500, "server_error",
                               code="worker_died")
            elif self._orphaned_since is None:
                self._orphaned_since = now  # another worker of its model may continue it: wait for its `accepted`
            elif now - self._orphaned_since > settings.queue_timeout_s:
                raise OvqError("The worker running this request died mid-generation and no other worker continued "
                               f"it within {settings.queue_timeout_s:.0f}s (queue_timeout_s)", 500, "server_error",
                               code="worker_died")

    async def _withdraw(self, job_ids: list[str]) -> None:
        """Jobs no worker took yet leave their stream (nobody runs them later); all are cancelled at their workers."""
        for job_id in job_ids:
            if job_id not in self.accepted:
                await self.client.registry.withdraw(self._queued[job_id], job_id, self.jobs[0].model)
        await self.client.cancel(job_ids, self.jobs[0].model)

    async def _survived(self) -> bool:
        """After the hub lost its subscription: jobs still queued (none started, so no event was missed) wait on,
        across a Redis restart with an append-only file; anything else may have lost events."""
        if self.accepted:
            return False
        if not self.client.hub.listening(self.inbox.channel):
            return True  # still away: wait (bounded by queue_timeout_s), then look again
        try:
            statuses = await self.client.statuses([job.id for job in self.jobs], self.jobs[0].model)
        except UNAVAILABLE:
            return True
        if all(status == QUEUED for status in statuses):
            self.inbox.lost = False
            return True
        return False

    async def close(self) -> None:
        """Forget the jobs; cancel at their workers those that have not ended (the client left, or we failed)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None  # its CancelledError's frames hold this generation: no cycle for the GC to find
        for job in self.jobs:
            self.client.hub.unregister(job.id)
        unfinished = [j for j in self._submitted if j in self.open and not self.detached]
        self.open.clear()
        if unfinished:
            try:
                await asyncio.shield(self._withdraw(unfinished))
            except UNAVAILABLE:
                log.warning("could not cancel %d jobs: Redis is unavailable (their workers see the API gone)",
                            len(unfinished))
