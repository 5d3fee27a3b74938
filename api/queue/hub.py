"""One pub/sub connection per API process carries the events of every job it waits for (on a Cluster, one per
model it enqueued for: `Keys.events` puts a job's channel in its model's slot, and `listen` subscribes to it before
the model's first job is queued).

Workers publish to this process's channel (`reply_to` in the job), one message per engine step holding
that step's events; the hub parses it once, in the socket's data callback (`api/queue/subscription.py`; orjson, no
model validation on this hot path: `common.events.read_batch`, which checks the message's version), and hands
each event to the inbox of the response waiting for it. A message of another version answers the jobs it names
with an error.

An inbox has a single waiter: its response's task sleeps until events arrive, then takes everything buffered at
once, so a response that falls behind catches up in one write. A streaming response's generation may also give
its inbox an `express` lane (`Generation.express`): a plain delta that finds nothing queued ahead of it is written
to the client from the hub's own callback, with no task wake-up at all. A ticker wakes idle inboxes every second,
which is how waits get their bounds (queue timeout, a dead worker, pings) without a timer per event.

If a connection to Redis drops, or goes silent (a PING unanswered), events published meanwhile are lost: every
inbox on that channel is told (`lost`), and the hub resubscribes with backoff, logging each attempt once.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from api.queue.subscription import Subscription, subscribe
from common import tasks
from common.events import EventDict, Unreadable, read_batch
from common.keys import Keys
from common.redis.client import UNAVAILABLE, Backoff, describe

log = logging.getLogger("ovq.api.hub")
TICK_S = 1.0
PING_S = 15.0  # a quiet subscription is checked with a PING this often
# Handles an event at once, from the hub's callback (True), or declines it (False: it is queued, as always).
Express = Callable[[EventDict], bool]


class Inbox:
    """Events for one response (one job, or one per prompt), buffered until its task takes them."""

    __slots__ = ("events", "_waiter", "last", "lost", "express", "channel", "legacy")

    def __init__(self, channel: str = "") -> None:
        self.channel = channel  # where its jobs' events come (`EventHub.channel`)
        self.legacy = False  # some came on the process's own channel instead (a Cluster: a worker of before)
        self.events: list[EventDict] = []
        self._waiter: asyncio.Future[None] | None = None
        self.last = time.monotonic()  # when events last came: pings, the liveness checks, the ticker
        self.lost = False  # the hub lost its subscription: events may be missing
        self.express: Express | None = None

    def push(self, event: EventDict) -> None:
        # Only with nothing queued: an event must not overtake those its task has not taken yet.
        if self.express is not None and not self.events and self.express(event):
            self.last = time.monotonic()
            return
        self.events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[EventDict]:
        """Everything buffered; if nothing is, wait for an event (or a tick: then an empty list)."""
        if not self.events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        events, self.events = self.events, []
        if events:
            self.last = time.monotonic()
        return events


class Listener:
    """One channel's subscription: kept up with backoff by its task, `subscribed` while it is."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.subscribed = asyncio.Event()
        self.subscription: Subscription | None = None
        self.ever_subscribed = False
        self.task: asyncio.Task[None] | None = None


class EventHub:
    def __init__(self, redis: aioredis.Redis, keys: Keys, url: str, timeout_s: float = 5.0) -> None:
        self.redis, self.keys, self.url, self.timeout_s = redis, keys, url, timeout_s
        self.reply_to = f"api-{uuid.uuid4().hex[:12]}"
        self._inboxes: dict[str, Inbox] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # The process's own channel (one Redis: every job's; a Cluster: that of workers before per-model channels),
        # then one per model it enqueued for (a Cluster: `Keys.events`), subscribed before its first job is queued.
        self._main = Listener(keys.events(self.reply_to))
        self._listeners: dict[str, Listener] = {self._main.channel: self._main}
        self.subscribed = self._main.subscribed
        self._unreadable: set[Any] = set()  # message versions already logged

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._tick(), name="event-hub-ticker")]
        self._open(self._main)
        try:  # usually at once; if Redis is away, the API still starts and answers 503 until it is back
            await asyncio.wait_for(self.subscribed.wait(), timeout=5)
        except asyncio.TimeoutError:
            pass

    async def stop(self) -> None:
        await tasks.stop([*self._tasks, *(lt.task for lt in self._listeners.values() if lt.task is not None)])

    def _open(self, listener: Listener) -> None:
        self._listeners[listener.channel] = listener
        listener.task = asyncio.create_task(self._run(listener), name=f"event-hub {listener.channel}")

    def channel(self, model: str) -> str:
        return self.keys.events(self.reply_to, model)

    async def listen(self, model: str) -> bool:
        """Whether this process listens on the channel of `model`'s jobs, subscribing first if it does not yet
        (bounded by the Redis timeout: False then, and the subscription goes on trying). The process's own channel
        is always taken as heard: while it is down, Redis is, and the enqueue says so."""
        listener = self._listeners.get(self.channel(model))
        if listener is self._main:
            return True
        if listener is None:
            listener = Listener(self.channel(model))
            self._open(listener)
        if listener.subscribed.is_set():
            return True
        try:
            await asyncio.wait_for(listener.subscribed.wait(), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def listening(self, channel: str) -> bool:
        listener = self._listeners.get(channel)
        return listener is not None and listener.subscribed.is_set()

    def register(self, job_id: str, inbox: Inbox) -> None:
        self._inboxes[job_id] = inbox

    def unregister(self, job_id: str) -> None:
        self._inboxes.pop(job_id, None)

    @property
    def waiting(self) -> int:
        return len(self._inboxes)

    async def _run(self, listener: Listener) -> None:
        backoff = Backoff()
        where = f"event hub waiting for Redis at {describe(self.url)}"
        while True:
            try:
                listener.subscription = await subscribe(self.redis, listener.channel, self._dispatch_legacy
                                                        if listener is self._main and self.keys.cluster
                                                        else self._dispatch, self.timeout_s)
            except (*UNAVAILABLE, redis.ResponseError) as exc:  # refused (an ACL without the channel): the same
                await asyncio.sleep(backoff.failed(log, where, exc))
                continue
            if listener.ever_subscribed:  # a resubscription: what was published in between is lost
                self._lost(listener.channel)
            listener.ever_subscribed = True
            listener.subscribed.set()
            backoff.succeeded(log, where)
            try:
                why = await listener.subscription.closed
            finally:
                listener.subscription.close(redis.ConnectionError("the event hub stopped"))
                listener.subscription = None
            listener.subscribed.clear()
            self._lost(listener.channel)
            await asyncio.sleep(backoff.failed(log, where, why))

    def _dispatch_legacy(self, data: bytes) -> None:
        """A message on a Cluster's process channel: its inboxes now also depend on that channel (`_lost`)."""
        self._dispatch(data, legacy=True)

    def _dispatch(self, data: bytes, legacy: bool = False) -> None:
        inboxes = self._inboxes
        try:
            events = read_batch(data)
        except Unreadable as exc:
            if exc.version not in self._unreadable:  # once per version: a mixed deployment sends many
                self._unreadable.add(exc.version)
                log.error("%s: answering its jobs with an error", exc)
            events = exc.errors()
        for event in events:
            inbox = inboxes.get(event["job"])
            if inbox is not None:
                if legacy:
                    inbox.legacy = True
                inbox.push(event)

    def _lost(self, channel: str) -> None:
        """The inboxes of the jobs on `channel` may have missed events. On a Cluster the process's own channel only
        concerns the inboxes whose events came there (from workers before per-model channels): a failover of the
        master it lives on ends no other stream."""
        for inbox in set(self._inboxes.values()):
            if channel == inbox.channel or (inbox.legacy and channel == self._main.channel):
                inbox.lost = True
                inbox.wake()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            for listener in list(self._listeners.values()):
                if listener.subscription is not None:
                    listener.subscription.check(PING_S, self.timeout_s)
            now = time.monotonic()
            for inbox in set(self._inboxes.values()):
                if now - inbox.last >= TICK_S:
                    inbox.wake()
