"""An API process announces itself as workers do, so workers can tell when nobody listens to a job any more.

Every heartbeat it refreshes its hash `Keys.api(reply_to)` (TTL OVQ_API_TTL_S) and its score in `Keys.apis`;
a worker whose job's `reply_to` scores older than the TTL cancels the job (running) or skips it (queued). On a
clean stop the score is set past the TTL at once.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import redis.asyncio as aioredis

from common import tasks
from common.keys import Keys
from common.redis.client import UNAVAILABLE
from common.settings import Settings

log = logging.getLogger("ovq.api.heartbeat")
# Gone API processes stay in the index this long: a job queued longer than that from a dead one is run anyway.
FORGET_S = 3600


class ApiHeartbeat:
    def __init__(self, redis: aioredis.Redis, keys: Keys, reply_to: str, settings: Settings) -> None:
        self.redis, self.keys, self.reply_to, self.settings = redis, keys, reply_to, settings
        self.started = time.time()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> ApiHeartbeat:
        try:
            await self.beat()  # announced before the first request can enqueue a job
        except UNAVAILABLE:
            pass  # the loop retries; the first job's enqueue says Redis is away
        self._task = asyncio.create_task(self._run(), name="api-heartbeat")
        return self

    async def stop(self) -> None:
        await tasks.stop(self._task)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(self.keys.api(self.reply_to))
            # Scored as already expired (not removed: an API missing from the index counts as still there).
            gone = time.time() - self.settings.api_ttl_s - 1
            pipe.zadd(self.keys.apis, {self.reply_to: gone}, xx=True)
            await asyncio.wait_for(pipe.execute(), timeout=2)
        except (asyncio.TimeoutError, *UNAVAILABLE):
            pass

    async def beat(self) -> None:
        now = time.time()
        key = self.keys.api(self.reply_to)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping={"host": socket.gethostname(), "pid": os.getpid(), "started": self.started,
                                "heartbeat": now})
        pipe.pexpire(key, int(self.settings.api_ttl_s * 1000))
        pipe.zadd(self.keys.apis, {self.reply_to: now})
        pipe.zremrangebyscore(self.keys.apis, "-inf", now - FORGET_S)
        pipe.expire(self.keys.apis, FORGET_S)
        await pipe.execute()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.beat()
            except UNAVAILABLE:
                pass  # Redis away: requests answer 503 and say so; beat again when it is back
            except Exception:
                log.exception("API heartbeat failed")
