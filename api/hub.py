"""One pub/sub connection per API process carries the events of every job it waits for.

Workers publish to this process's own channel (`reply_to` in the job); the hub hands each event to the
queue of its job. No per-request subscription, so no race between subscribing and enqueueing.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import redis.asyncio as aioredis

from common.events import batch_adapter
from common.keys import Keys

log = logging.getLogger("ovq.api.hub")


class EventHub:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.reply_to = f"api-{uuid.uuid4().hex[:12]}"
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._pubsub: Any = None

    async def start(self) -> None:
        self._pubsub = self.redis.pubsub()
        await self._pubsub.subscribe(self.keys.events(self.reply_to))
        while (await self._pubsub.get_message(timeout=5.0)) is None:  # wait for the subscription's confirmation
            pass
        self._task = asyncio.create_task(self._run(), name="event-hub")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self._pubsub is not None:
            await self._pubsub.aclose()

    def register(self, job_id: str) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[job_id] = queue
        return queue

    def unregister(self, job_id: str) -> None:
        self._queues.pop(job_id, None)

    async def _run(self) -> None:
        while True:
            try:
                async for message in self._pubsub.listen():
                    if message["type"] == "message":
                        self._dispatch(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event hub lost its connection; resubscribing")
                await asyncio.sleep(0.5)

    def _dispatch(self, data: bytes) -> None:
        for event in batch_adapter.validate_json(data).events:
            queue = self._queues.get(event.job)
            if queue is not None:
                queue.put_nowait(event)
