"""Refusals counted where every API process's count adds up: the model's stats windows in Redis.

A refusal (deadline, quota, queue full) happens in one API process; Prometheus sees that process's counter, the
ops page and `ovq status` need the fleet's. Each process counts in memory and adds its counts to the current stats
window (`Keys.stats` of the model's first device, fields `refused:<reason>`, TTL OVQ_STATS_TTL_S) at most once a
second, in one round trip: a flood of refusals costs Redis one HINCRBY per reason a second, not one per request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import redis.asyncio as aioredis

from common import tasks
from common.keys import Keys
from common.ops.stats import window_of
from common.redis.client import UNAVAILABLE

log = logging.getLogger("ovq.api.refusals")
FLUSH_S = 1.0


class Refusals:
    def __init__(self, redis: aioredis.Redis, keys: Keys, stats_ttl_s: int) -> None:
        self.redis, self.keys, self.stats_ttl_s = redis, keys, stats_ttl_s
        self.pending: Counter[tuple[str, str, str]] = Counter()  # (model, device, reason)
        self._task: asyncio.Task[None] | None = None

    def count(self, model: str, device: str, reason: str) -> None:
        self.pending[model, device, reason] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_S)
        await self.flush()

    async def flush(self) -> None:
        """Write what is pending; kept for the next refusal's flush while Redis is away."""
        sending, self.pending = self.pending, Counter()
        if not sending:
            return
        window = window_of(time.time())
        pipe = self.redis.pipeline(transaction=False)
        for (model, device, reason), n in sending.items():
            key = self.keys.stats(model, device, window)
            pipe.hincrby(key, f"refused:{reason}", n)
            pipe.expire(key, self.stats_ttl_s)
        try:
            await asyncio.wait_for(pipe.execute(), FLUSH_S * 5)
        except (asyncio.TimeoutError, *UNAVAILABLE):
            self.pending.update(sending)
            log.warning("refusal counts not written (Redis unavailable): kept for the next try")

    async def stop(self) -> None:
        await tasks.stop(self._task)
        await self.flush()
