"""One pub/sub connection per API process carries the events of every job it waits for.

Workers publish to this process's own channel (`reply_to` in the job), one message per engine step holding
that step's events; the hub parses it once, in the socket's data callback (`api/queue/subscription.py`; orjson, no
model validation on this hot path: `common.events.read_batch`, which checks the message's version), and hands
each event to the inbox of the response waiting for it. A message of another version answers the jobs it names
with an error.

An inbox has a single waiter: its response's task sleeps until events arrive, then takes everything buffered at
once, so a response that falls behind catches up in one write. A streaming response's generation may also give
its inbox an `express` lane (`Generation.express`): a plain delta that finds nothing queued ahead of it is written
to the client from the hub's own callback, with no task wake-up at all. A ticker wakes idle inboxes every second,
which is how waits get their bounds (queue timeout, a dead worker, pings) without a timer per event.

If the connection to Redis drops, or goes silent (a PING unanswered), events published meanwhile are lost: every
inbox is told (`lost`), and the hub resubscribes with backoff, logging each attempt once.
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

    __slots__ = ("events", "_waiter", "last", "lost", "express")

    def __init__(self) -> None:
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


class EventHub:
    def __init__(self, redis: aioredis.Redis, keys: Keys, url: str, timeout_s: float = 5.0) -> None:
        self.redis, self.keys, self.url, self.timeout_s = redis, keys, url, timeout_s
        self.reply_to = f"api-{uuid.uuid4().hex[:12]}"
        self._inboxes: dict[str, Inbox] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._subscription: Subscription | None = None
        self.subscribed = asyncio.Event()
        self._ever_subscribed = False
        self._unreadable: set[Any] = set()  # message versions already logged

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(), name="event-hub"),
                       asyncio.create_task(self._tick(), name="event-hub-ticker")]
        try:  # usually at once; if Redis is away, the API still starts and answers 503 until it is back
            await asyncio.wait_for(self.subscribed.wait(), timeout=5)
        except asyncio.TimeoutError:
            pass

    async def stop(self) -> None:
        await tasks.stop(self._tasks)

    def register(self, job_id: str, inbox: Inbox) -> None:
        self._inboxes[job_id] = inbox

    def unregister(self, job_id: str) -> None:
        self._inboxes.pop(job_id, None)

    @property
    def waiting(self) -> int:
        return len(self._inboxes)

    async def _run(self) -> None:
        backoff = Backoff()
        where = f"event hub waiting for Redis at {describe(self.url)}"
        channel = self.keys.events(self.reply_to)
        while True:
            try:
                self._subscription = await subscribe(self.redis, channel, self._dispatch, self.timeout_s)
            except (*UNAVAILABLE, redis.ResponseError) as exc:  # refused (an ACL without the channel): the same
                await asyncio.sleep(backoff.failed(log, where, exc))
                continue
            if self._ever_subscribed:  # a resubscription: what was published in between is lost
                self._lost()
            self._ever_subscribed = True
            self.subscribed.set()
            backoff.succeeded(log, where)
            try:
                why = await self._subscription.closed
            finally:
                self._subscription.close(redis.ConnectionError("the event hub stopped"))
                self._subscription = None
            self.subscribed.clear()
            self._lost()
            await asyncio.sleep(backoff.failed(log, where, why))

    def _dispatch(self, data: bytes) -> None:
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
                inbox.push(event)

    def _lost(self) -> None:
        for inbox in set(self._inboxes.values()):
            inbox.lost = True
            inbox.wake()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if self._subscription is not None:
                self._subscription.check(PING_S, self.timeout_s)
            now = time.monotonic()
            for inbox in set(self._inboxes.values()):
                if now - inbox.last >= TICK_S:
                    inbox.wake()
