"""What a worker reads next: interactive jobs first, batch jobs only when no interactive job waits.

Each model and device has two streams: interactive requests, and Batch API lines (`Keys.batch_jobs`). A read
takes only interactive jobs while any wait, so a batch never makes an interactive request wait behind it in
Redis; only when the interactive stream has nothing does the read take from the batch stream. An idle worker
blocks on both at once, so it wakes for either.
"""
from __future__ import annotations

import redis.asyncio as aioredis

from common.keys import GROUP

Entries = list[tuple[bytes, dict[bytes, bytes]]]


class Intake:
    def __init__(self, redis: aioredis.Redis, consumer: str, interactive: str, batch: str) -> None:
        self.redis, self.consumer = redis, consumer
        self.interactive, self.batch = interactive, batch

    async def read(self, count: int, block_ms: int) -> list[tuple[str, Entries]]:
        """Up to `count` jobs as (stream, entries), interactive stream first; blocks up to `block_ms` when both
        are empty. The blocking read takes one entry per stream: rarely, when both streams get a job at the same
        moment, that is one job beyond `count` (the interactive one comes first)."""
        for stream in (self.interactive, self.batch):
            reply = await self.redis.xreadgroup(GROUP, self.consumer, {stream: ">"}, count=count)
            if reply:
                return [(stream, reply[0][1])]
        reply = await self.redis.xreadgroup(GROUP, self.consumer, {self.interactive: ">", self.batch: ">"},
                                            count=1, block=block_ms)
        got = {(s.decode() if isinstance(s, bytes) else s): entries for s, entries in reply or []}
        return [(stream, got[stream]) for stream in (self.interactive, self.batch) if got.get(stream)]
