"""Liveness and the model card: what tells the API this worker exists and what its model accepts."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from typing import TYPE_CHECKING

from common.redis.client import UNAVAILABLE, Backoff, describe, redis_url

if TYPE_CHECKING:
    from workers.base import BaseWorker

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


class Heartbeat:
    def __init__(self, worker: BaseWorker) -> None:
        self.worker = worker
        self.host = socket.gethostname()
        self.last_ok = time.monotonic()
        self.rate = Rate()

    async def beat(self) -> None:
        w, keys = self.worker, self.worker.keys
        now = time.time()
        ttl_ms = int(w.settings.worker_ttl_s * 1000)
        pipe = w.redis.pipeline(transaction=False)
        stats = w.engine_stats()
        pipe.hset(keys.worker(w.id), mapping={
            "model": w.model.name, "device": w.device, "servable_type": w.card.servable_type.value,
            "capacity": w.capacity, "running": len(w.running), "stream": w.stream, "heartbeat": now,
            "host": self.host, "pid": os.getpid(), "started": w.started, "draining": int(w.draining),
            "kv_cache_usage": stats[2] / 100 if stats else 0.0, "jobs_taken": w.jobs_taken,
            "tokens_generated": w.tokens_generated, "port": w.health.port if w.health else 0,
            "tokens_per_s": round(self.rate.update(now, w.tokens_generated), 2),
        })
        pipe.pexpire(keys.worker(w.id), ttl_ms)
        pipe.zadd(keys.workers(w.model.name, w.device), {w.id: now})
        pipe.zremrangebyscore(keys.workers(w.model.name, w.device), "-inf", now - 10 * w.settings.worker_ttl_s)
        # The card outlives its workers for a while, so the API can tell "model not served right now" (503)
        # from "no such model" (404).
        card_ttl = w.settings.model_card_ttl_s
        pipe.hset(keys.model(w.model.name), w.device, w.card.model_dump_json())
        pipe.expire(keys.model(w.model.name), card_ttl)
        pipe.zadd(keys.models, {w.model.name: now})
        pipe.zremrangebyscore(keys.models, "-inf", now - card_ttl)
        pipe.expire(keys.models, card_ttl)
        # Steering, in the same round trip: an operator's drain request, and whether the API processes of the
        # running jobs still listen.
        pipe.exists(keys.drain(w.id))
        listeners = sorted({state.job.reply_to for state in w.running.values()})
        if listeners:
            pipe.zmscore(keys.apis, listeners)
        replies = await pipe.execute()
        if listeners:
            w.cancel_orphans(w.gone_apis(listeners, replies.pop()))
        if replies[-1] and not w.draining:
            w.stop("an operator asked it to drain")

    async def run(self) -> None:
        """Beat every heartbeat_s; while Redis is away, retry with backoff, one log line per attempt (this loop
        speaks for the worker's others, which back off quietly)."""
        settings = self.worker.settings
        # Retry often enough that the worker is seen alive again within its TTL once Redis is back.
        backoff = Backoff(first=settings.heartbeat_s, cap=max(settings.heartbeat_s, settings.worker_ttl_s / 2))
        where = f"worker {self.worker.id} waiting for Redis at {describe(redis_url(self.worker.settings))}"
        while True:
            try:
                await self.beat()
            except UNAVAILABLE as exc:
                await asyncio.sleep(backoff.failed(log, where, exc))
                continue
            self.last_ok = time.monotonic()
            backoff.succeeded(log, where)
            await asyncio.sleep(self.worker.settings.heartbeat_s)

    async def leave(self) -> None:
        w, keys = self.worker, self.worker.keys
        pipe = w.redis.pipeline(transaction=False)
        pipe.delete(keys.worker(w.id), keys.drain(w.id))
        pipe.zrem(keys.workers(w.model.name, w.device), w.id)
        await pipe.execute()
