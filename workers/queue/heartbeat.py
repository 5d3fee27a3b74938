"""Liveness and the model card: what tells the API this worker exists and what its model accepts. Each beat also
brings back the steering the worker acts on: an operator's drain request, and which API processes are gone."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

import redis.asyncio as aioredis

from common.keys import Keys
from common.redis.client import UNAVAILABLE, Backoff, describe, redis_url
from common.settings import Settings
from workers.queue.fence import Fence
from workers.vitals import Member, Vitals

log = logging.getLogger("ovq.worker")


class Rate:
    """A counter's rate per second over about the last RATE_WINDOW_S, from the samples the heartbeats take."""

    RATE_WINDOW_S = 10.0

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, total: int) -> float:
        self.samples.append((now, total))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.RATE_WINDOW_S:
            self.samples.popleft()
        then, before = self.samples[0]
        return (total - before) / (now - then) if now > then else 0.0


@dataclass(frozen=True)
class Steering:
    """What a beat learned for the worker to act on."""

    drain: bool = False  # an operator asked this worker to drain (`ovq worker drain`)
    gone: set[str] = field(default_factory=set)  # API processes of running jobs that are gone
    unread: set[str] = field(default_factory=set)  # resumable jobs no API process has streamed for the grace period
    command: str | None = None  # an operator's `sleep` or `wake` (`ovq worker sleep|wake`), taken once
    api_scores: dict[str, float | None] = field(default_factory=dict)  # the heartbeats read of the running jobs' APIs


def gone_apis(reply_tos: list[str], scores: list[float | None], api_ttl_s: float) -> set[str]:
    """API processes whose heartbeat (score) is older than `api_ttl_s`. One never heard of (an API without
    heartbeats, or a retried dead letter: `ops-retry`) counts as there: nobody can tell it is gone."""
    since = time.time() - api_ttl_s
    return {r for r, score in zip(reply_tos, scores, strict=True) if score is not None and score < since}


class Heartbeat:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings, member: Member,
                 vitals: Callable[[], Vitals], fence: Fence | None = None) -> None:
        """`fence`: checked before the worker's next publish after a beat failed (another worker may have taken
        this one's jobs over meanwhile)."""
        self.redis, self.keys, self.settings, self.member, self.vitals = redis, keys, settings, member, vitals
        self.fence = fence
        self.host = socket.gethostname()
        self.last_ok = time.monotonic()
        self.reachable_since: float | None = self.last_ok  # None while beats fail
        self.rate = Rate()

    async def beat(self) -> Steering:
        m, keys, settings, v = self.member, self.keys, self.settings, self.vitals()
        now = time.time()
        ttl_ms = int(settings.worker_ttl_s * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(keys.worker(m.id), mapping={
            "model": m.model, "device": m.device, "servable_type": v.card.servable_type.value,
            "capacity": v.capacity, "running": v.running, "stream": m.stream, "heartbeat": now,
            "host": self.host, "pid": os.getpid(), "started": m.started, "draining": int(v.draining),
            "kv_cache_usage": v.kv_cache_usage, "jobs_taken": v.jobs_taken,
            "tokens_generated": v.tokens_generated, "port": v.port,
            "tokens_per_s": round(self.rate.update(now, v.tokens_generated), 2),
            "admission_knee": v.admission_knee, "admission_limit": v.admission_limit,
            "pool": v.pool, "state": v.state, "can_sleep": int(v.can_sleep),
            "woke_in_s": "" if v.woke_in_s is None else round(v.woke_in_s, 3),
        })
        pipe.pexpire(keys.worker(m.id), ttl_ms)
        pipe.zadd(keys.workers(m.model, m.device), {m.id: now})
        pipe.zremrangebyscore(keys.workers(m.model, m.device), "-inf", now - 10 * settings.worker_ttl_s)
        # A member can outlive its worker (one stopped while its first beat was in flight): once no worker of the
        # model beats, the whole set goes with the members the beats above would have pruned.
        pipe.expire(keys.workers(m.model, m.device), int(10 * settings.worker_ttl_s) + 1)
        # The card outlives its workers for a while, so the API can tell "model not served right now" (503)
        # from "no such model" (404).
        card_ttl = settings.model_card_ttl_s
        pipe.hset(keys.model(m.model), m.device, v.card.model_dump_json())
        pipe.expire(keys.model(m.model), card_ttl)
        pipe.zadd(keys.models, {m.model: now})
        pipe.zremrangebyscore(keys.models, "-inf", now - card_ttl)
        pipe.expire(keys.models, card_ttl)
        # Steering, in the same round trip: an operator's drain request, and whether the API processes of the
        # running jobs still listen.
        pipe.exists(keys.drain(m.id))
        pipe.getdel(keys.steer(m.id))
        followed = sorted(v.followed)
        for job in followed:  # a resumable stream's reader lease: gone once its client stayed away the grace period
            pipe.exists(keys.reader(job, m.model))
        listeners = sorted(v.listeners)
        if listeners:
            pipe.zmscore(keys.apis, listeners)
        replies = await pipe.execute()
        scores = [None if v is None else float(v) for v in replies.pop()] if listeners else []
        gone = gone_apis(listeners, scores, settings.api_ttl_s) if listeners else set()
        read = [replies.pop() for _ in followed][::-1]
        unread = {job for job, n in zip(followed, read, strict=True) if not n}
        command = replies[-1].decode() if replies[-1] else None
        return Steering(drain=bool(replies[-2]), gone=gone, unread=unread, command=command,
                        api_scores=dict(zip(listeners, scores, strict=True)))

    async def beats(self) -> AsyncIterator[Steering]:
        """Beat every heartbeat_s, each beat's steering; while Redis is away, retry with backoff, one log line per
        attempt (this loop speaks for the worker's others, which back off quietly)."""
        settings = self.settings
        # Retry often enough that the worker is seen alive again within its TTL once Redis is back.
        backoff = Backoff(first=settings.heartbeat_s, cap=max(settings.heartbeat_s, settings.worker_ttl_s / 2))
        where = f"worker {self.member.id} waiting for Redis at {describe(redis_url(settings))}"
        while True:
            try:
                steering = await self.beat()
            except UNAVAILABLE as exc:
                self.reachable_since = None
                if self.fence is not None:
                    self.fence.due = True
                await asyncio.sleep(backoff.failed(log, where, exc))
                continue
            self.last_ok = time.monotonic()
            if self.reachable_since is None:
                self.reachable_since = self.last_ok
            backoff.succeeded(log, where)
            yield steering if self.judges_apis() else replace(steering, gone=set())
            await asyncio.sleep(settings.heartbeat_s)

    def steady_for(self, seconds: float) -> bool:
        """Whether Redis has answered this worker's beats for the last `seconds`."""
        since = self.reachable_since
        return since is not None and time.monotonic() - since >= seconds

    def steady(self) -> bool:
        """Whether Redis has answered this worker's beats for a whole worker TTL: only then can a stale heartbeat
        say its worker is dead. After an outage every worker's heartbeat is stale; one that is alive beats again
        within a TTL of Redis coming back, so judging earlier would take over (and, with takeover, run twice) the
        jobs of live workers."""
        return self.steady_for(self.settings.worker_ttl_s)

    def judges_apis(self) -> bool:
        """Whether a stale API heartbeat can say its API process is gone: the same rule for API processes, over
        OVQ_API_TTL_S. After Redis was away (an outage, a Sentinel failover) every API's score is stale until it
        beats again, within a heartbeat of Redis answering; judging earlier cancels the jobs of live API
        processes (the chaos run saw a 6 s failover cancel three running jobs of a live API)."""
        return self.steady_for(self.settings.api_ttl_s)

    async def leave(self) -> None:
        m, keys = self.member, self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.worker(m.id), keys.drain(m.id), keys.steer(m.id))
        pipe.zrem(keys.workers(m.model, m.device), m.id)
        await pipe.execute()
