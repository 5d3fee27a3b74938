"""A worker's side of a configuration reload (docs/how-to/reload.md): it follows its own copy of the models file
(common/models/watch.py) and the fleet's reload generation in Redis.

- Its model changed (any option): it restarts its engine with the new options (`BaseWorker.reconfigure`: no new job
  meanwhile, running ones finish first, waiting ones wait in the stream), one worker of the model at a time (a lock
  in Redis, `Keys.reload_lock`), so the model keeps serving through a rolling restart.
- Its model was removed (or its device was): it drains: it goes on taking the jobs already queued for it and, once
  its streams are empty and nothing runs for a settling while (the API processes stop queueing within their own
  poll interval), it stops as on SIGTERM.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from common.keys import Keys
from common.models.config import ModelConfig
from common.models.watch import ConfigWatch
from common.redis.client import UNAVAILABLE
from common.settings import Settings

log = logging.getLogger("ovq.worker")

UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class Follower:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings, worker_id: str, model: ModelConfig,
                 device: str, reconfigure: Callable[[ModelConfig], Awaitable[None]],
                 idle: Callable[[], Awaitable[bool]], retire: Callable[[str], None]) -> None:
        self.redis, self.keys, self.settings, self.worker_id = redis, keys, settings, worker_id
        self.model, self.device = model, device
        self._reconfigure, self._idle, self._retire = reconfigure, idle, retire
        self.watch = ConfigWatch(settings)
        self.settle_s = 2 * settings.config_poll_s + 1.0
        # Held this long at most: the running jobs' grace, the engine's start, and some slack.
        self.lock_s = int(settings.shutdown_grace_s + settings.engine_start_timeout_s + 30)

    @property
    def enabled(self) -> bool:
        return self.watch.path is not None and self.settings.config_poll_s > 0

    async def run(self) -> None:
        """Until the model is removed (then returns, having asked the worker to stop)."""
        self.watch.heard(await self._generation())
        while True:
            await asyncio.sleep(self.settings.config_poll_s)
            generation = await self._generation()
            self.watch.poll(self.watch.heard(generation))
            wanted = self.watch.catalog.model(self.model.name)
            if wanted is None or self.device not in [d.upper() for d in wanted.devices]:
                await self._drain()
                return
            if wanted != self.model and await self._lock():
                try:
                    await self._reconfigure(wanted)
                finally:
                    self.model = wanted  # tried once: a configuration that fails to start is not retried each tick
                    await self._unlock()

    async def _generation(self) -> int | None:
        try:
            value = await self.redis.get(self.keys.config_generation)
        except UNAVAILABLE:
            return None
        return int(value) if value is not None else 0

    async def _lock(self) -> bool:
        try:
            return bool(await self.redis.set(self.keys.reload_lock(self.model.name), self.worker_id, nx=True,
                                             ex=self.lock_s))
        except UNAVAILABLE:
            return False

    async def _unlock(self) -> None:
        try:
            await self.redis.eval(UNLOCK, 1, self.keys.reload_lock(self.model.name), self.worker_id)
        except UNAVAILABLE:  # its TTL frees it
            pass

    async def _drain(self) -> None:
        log.warning("worker %s: %s on %s is no longer in the models file; finishing its queued and running jobs, "
                    "then stopping", self.worker_id, self.model.name, self.device)
        idle_since: float | None = None
        while True:
            try:
                idle = await self._idle()
            except UNAVAILABLE:
                idle = False
            now = time.monotonic()
            idle_since = (idle_since or now) if idle else None
            if idle_since is not None and now - idle_since >= self.settle_s:
                self._retire("its model was removed from the models file")
                return
            await asyncio.sleep(min(self.settings.config_poll_s, 0.5))
