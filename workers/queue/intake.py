"""What a worker reads next: the highest priority level first, a lower level's job once it has waited too long.

Each model and device has one stream per priority level (`common.jobs.LEVELS`: high, interactive, low, batch;
`Keys.level_jobs`). One Lua call reads them highest first and returns the first level with an undelivered entry:
atomic, so no job arriving between two reads is passed over. Before that it ages: each
level's oldest undelivered job (batch excepted: Batch API lines only run when nothing else waits) rises one level
per `aging_s` it has waited (a stream id's milliseconds are its enqueue time, Redis clock), and the job ranking
highest so (ties: the higher level) is taken, one per read when it is not the highest level's; so a low-priority
job starts within (its level's distance to the highest + 1) x `aging_s` however much higher-priority work arrives,
while levels still hold among jobs that all waited long (Slurm's age factor, not a FIFO). An idle worker then
blocks on every stream at once, so it wakes for any.
"""
from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.keys import GROUP
from common.redis.cluster import open_lane
from common.redis.lane import Script

Entries = list[tuple[bytes, dict[bytes, bytes]]]

# KEYS: the streams, highest level first. ARGV: group, consumer, count, aging (ms; 0: none), the number of
# streams subject to aging counted from the first (the last, batch, is not).
# Returns {the stream's index (1-based), its entries}, or {0, {}} when none has an undelivered entry.
READ = """
local function oldest_waiting(key)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
  if not ok then return nil end
  for _, group in ipairs(groups) do
    local fields = {}
    for j = 1, #group, 2 do fields[group[j]] = group[j + 1] end
    if fields['name'] == ARGV[1] then
      local next = redis.call('XRANGE', key, '(' .. fields['last-delivered-id'], '+', 'COUNT', 1)
      if #next == 0 then return nil end
      return tonumber(string.match(next[1][1], '^(%d+)'))
    end
  end
  return nil
end
local aging = tonumber(ARGV[4])
if aging > 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local best, best_rank, first = 0, nil, 0
  for i = 1, tonumber(ARGV[5]) do
    local t = oldest_waiting(KEYS[i])
    if t then
      if first == 0 then first = i end
      local rank = i - math.floor((now_ms - t) / aging)
      if best_rank == nil or rank < best_rank then best, best_rank = i, rank end
    end
  end
  if best > 0 and best ~= first then
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[best], '>')
    if reply then return {best, reply[1][2]} end
  end
end
for i = 1, #KEYS do
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[i], '>')
  if reply then return {i, reply[1][2]} end
end
return {0, {}}
"""


def _entries(raw: list) -> Entries:
    """Lua's reply is raw: [id, [field, value, ...]] per entry."""
    return [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in raw]


class Intake:
    def __init__(self, redis: aioredis.Redis, consumer: str, *streams: str, aging_s: float = 0.0) -> None:
        """`streams`: highest level first, the batch stream last."""
        self.consumer = consumer
        self.streams = streams
        self.aging_ms = int(aging_s * 1000)
        # A lane of its own: the blocking read holds its connection for up to `block_ms`.
        self.lane = open_lane(redis)
        self._read = Script(READ)

    async def read(self, count: int, block_ms: int) -> list[tuple[str, Entries]]:
        """Up to `count` jobs as (stream, entries), highest level first (an aged one before all); blocks up to
        `block_ms` when every stream is empty. The blocking read takes one entry per stream: rarely, when several
        streams get a job at the same moment, that is a few jobs beyond `count` (the highest level first)."""
        which, raw = await self._read(self.lane, keys=list(self.streams),
                                      args=[GROUP, self.consumer, count, self.aging_ms, len(self.streams) - 1])
        if which:
            return [(self.streams[which - 1], _entries(raw))]
        [reply] = await self.lane.execute([["XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", 1, "BLOCK", block_ms,
                                            "STREAMS", *self.streams, *(">" for _ in self.streams)]], block_ms / 1000)
        if isinstance(reply, ResponseError):
            raise reply
        got = {s.decode(): _entries(entries) for s, entries in _by_stream(reply)}
        return [(stream, got[stream]) for stream in self.streams if got.get(stream)]

    async def close(self) -> None:
        await self.lane.close()


def _by_stream(reply: Any) -> list[tuple[bytes, list]]:
    """XREADGROUP's reply on a lane (RESP2): a list of [stream, entries] pairs, or nil."""
    return [(s, entries) for s, entries in reply or []]
