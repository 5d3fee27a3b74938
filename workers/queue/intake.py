"""What a worker reads next: interactive jobs first, batch jobs only when no interactive job waits.

Each model and device has two streams: interactive requests, and Batch API lines (`Keys.batch_jobs`). One Lua
call reads the interactive stream and, only when it has nothing undelivered, the batch stream: atomic, so no
interactive job arriving between two reads is passed over, and a batch never makes an interactive request wait
behind it in Redis. An idle worker then blocks on both streams at once, so it wakes for either.
"""
from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.keys import GROUP
from common.redis.lane import Lane, Script

Entries = list[tuple[bytes, dict[bytes, bytes]]]

# KEYS: interactive stream, batch stream. ARGV: group, consumer, count.
# Returns {1 or 2 (the stream read), its entries}, or {0, {}} when neither has an undelivered entry.
READ = """
for i = 1, 2 do
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[i], '>')
  if reply then return {i, reply[1][2]} end
end
return {0, {}}
"""


def _entries(raw: list) -> Entries:
    """Lua's reply is raw: [id, [field, value, ...]] per entry."""
    return [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in raw]


class Intake:
    def __init__(self, redis: aioredis.Redis, consumer: str, interactive: str, batch: str) -> None:
        self.consumer = consumer
        self.interactive, self.batch = interactive, batch
        # A lane of its own: the blocking read holds its connection for up to `block_ms`.
        self.lane = Lane(redis)
        self._read = Script(READ)

    async def read(self, count: int, block_ms: int) -> list[tuple[str, Entries]]:
        """Up to `count` jobs as (stream, entries), interactive stream first; blocks up to `block_ms` when both
        are empty. The blocking read takes one entry per stream: rarely, when both streams get a job at the same
        moment, that is one job beyond `count` (the interactive one first)."""
        which, raw = await self._read(self.lane, keys=[self.interactive, self.batch],
                                      args=[GROUP, self.consumer, count])
        if which:
            return [((self.interactive, self.batch)[which - 1], _entries(raw))]
        [reply] = await self.lane.execute([["XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", 1, "BLOCK", block_ms,
                                            "STREAMS", self.interactive, self.batch, ">", ">"]], block_ms / 1000)
        if isinstance(reply, ResponseError):
            raise reply
        got = {s.decode(): _entries(entries) for s, entries in _by_stream(reply)}
        return [(stream, got[stream]) for stream in (self.interactive, self.batch) if got.get(stream)]

    async def close(self) -> None:
        await self.lane.close()


def _by_stream(reply: Any) -> list[tuple[bytes, list]]:
    """XREADGROUP's reply on a lane (RESP2): a list of [stream, entries] pairs, or nil."""
    return [(s, entries) for s, entries in reply or []]
