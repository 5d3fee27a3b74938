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

Fair shares per tenant (common/fairness.py): within a level, jobs that carry a tenant are parked by the API's
enqueue, and taken here in weighted fair order (lowest virtual start time first) after the level's plain entries;
an idle worker's blocking read includes the model's bell, which the enqueue rings when it parks a job.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.fairness import PARK
from common.keys import GROUP, Keys
from common.redis.client import is_unblocked
from common.redis.cluster import open_lane
from common.redis.lane import Script

Entries = list[tuple[bytes, dict[bytes, bytes]]]

# Lua, shared with the affinity scripts: a read's entries as one bulk string (`unpack` reads it), not a table. Redis
# 6.2 (the embedded server) starts a new reply block at every nested array a script returns, and writes each block
# in a write(2) of its own: a read of 8 jobs was 19 writes, the most costly thing Redis did per job (strace,
# benchmarks/scale.py). Header: `which extra`, then per entry its id, how many field items, and each one's length,
# separated by spaces; a newline; then the items' bytes, in order.
PACK = """
local function pack(which, got, extra)
  local head, body = {tostring(which), tostring(extra or 0)}, {}
  for _, entry in ipairs(got) do
    local items = entry[2] or {}
    head[#head + 1] = entry[1]
    head[#head + 1] = tostring(#items)
    for _, item in ipairs(items) do
      head[#head + 1] = tostring(#item)
      body[#body + 1] = item
    end
  end
  return table.concat(head, ' ') .. '\\n' .. table.concat(body)
end
"""

# Lua, shared with the affinity scripts (workers/queue/affinity.py): level i's oldest waiting job (enqueue time, ms),
# undelivered or parked; nil for none. Needs in scope `n` (how many streams) and `fair` (KEYS holds each level's
# order set after the streams).
OLDEST_WAITING = """
local function id_ms(id) return tonumber(string.match(id, '^(%d+)')) end
local function oldest_waiting(i)
  local key, oldest = KEYS[i], nil
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
  if not ok then return nil end
  for _, group in ipairs(groups) do
    local fields = {}
    for j = 1, #group, 2 do fields[group[j]] = group[j + 1] end
    if fields['name'] == ARGV[1] then
      local next = redis.call('XRANGE', key, '(' .. fields['last-delivered-id'], '+', 'COUNT', 1)
      if #next > 0 then oldest = id_ms(next[1][1]) end
    end
  end
  if fair and redis.call('ZCARD', KEYS[n + i]) > 0 then
    local parked = redis.call('XPENDING', key, ARGV[1], '-', '+', 1, ARGV[7])
    if #parked > 0 and (oldest == nil or id_ms(parked[1][1]) < oldest) then oldest = id_ms(parked[1][1]) end
  end
  return oldest
end
"""
# KEYS: the streams, highest level first; with fair shares (common/fairness.py) then each level's fair order set,
# then each level's clock, in the same order. ARGV: group, consumer, count, aging (ms; 0: none), the number of
# streams subject to aging counted from the first (the last, batch, is not), the number of streams, the parking
# consumer. A level's jobs: its plain undelivered entries first (jobs without a tenant), then its parked ones,
# lowest virtual start time first.
# Returns (packed: PACK) the stream's index (1-based) and its entries, or 0 and none when none has a waiting entry.
READ = PACK + """
local n = tonumber(ARGV[6])
local fair = #KEYS > n
""" + OLDEST_WAITING + """
local function take(i, count)
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', KEYS[i], '>')
  if reply then return reply[1][2] end
  if not fair then return nil end
  local order, clock, got = KEYS[n + i], KEYS[2 * n + i], {}
  while #got < tonumber(count) do
    local popped = redis.call('ZPOPMIN', order)
    if #popped == 0 then break end
    local sep = string.find(popped[1], '|', 1, true)
    local id, tenant = string.sub(popped[1], 1, sep - 1), string.sub(popped[1], sep + 1)
    if tonumber(popped[2]) > tonumber(redis.call('HGET', clock, 'v') or '0') then
      redis.call('HSET', clock, 'v', popped[2])
    end
    if redis.call('HINCRBY', clock, 'n:' .. tenant, -1) <= 0 then redis.call('HDEL', clock, 'n:' .. tenant) end
    for _, entry in ipairs(redis.call('XCLAIM', KEYS[i], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', 1)) do
      if entry[2] then got[#got + 1] = entry else redis.call('XACK', KEYS[i], ARGV[1], id) end
    end
  end
  if #got > 0 then return got end
  return nil
end
local aging = tonumber(ARGV[4])
if aging > 0 then  -- aging reorders levels only where two of them hold entries: XLEN first, the cheap check
  local held = 0
  for i = 1, tonumber(ARGV[5]) do
    if redis.call('XLEN', KEYS[i]) > 0 then held = held + 1 end
  end
  if held < 2 then aging = 0 end
end
if aging > 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local best, best_rank, first = 0, nil, 0
  for i = 1, tonumber(ARGV[5]) do
    local t = oldest_waiting(i)
    if t then
      if first == 0 then first = i end
      local rank = i - math.floor((now_ms - t) / aging)
      if best_rank == nil or rank < best_rank then best, best_rank = i, rank end
    end
  end
  if best > 0 and best ~= first then
    local got = take(best, 1)
    if got then return pack(best, got) end
  end
end
for i = 1, n do
  local got = take(i, ARGV[3])
  if got then return pack(i, got) end
end
return pack(0, {})
"""


def _entries(raw: list) -> Entries:
    """Lua's reply is raw: [id, [field, value, ...]] per entry."""
    return [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in raw]


def unpack(blob: bytes) -> tuple[int, Entries, int]:
    """A PACK reply: which stream (0: none), its entries, and the script's extra number."""
    head, _, body = blob.partition(b"\n")
    tokens = head.split(b" ")
    entries: Entries = []
    t, at = 2, 0
    while t < len(tokens):
        entry_id, count = tokens[t], int(tokens[t + 1])
        items = []
        for size in tokens[t + 2:t + 2 + count]:
            end = at + int(size)
            items.append(body[at:end])
            at = end
        entries.append((entry_id, dict(zip(items[::2], items[1::2], strict=True))))
        t += 2 + count
    return int(tokens[0]), entries, int(tokens[1])


@dataclass(frozen=True)
class FairKeys:
    """A worker's fair-share keys (common/fairness.py): each level's order set and clock, in its streams' order, and
    its model's bell."""

    orders: tuple[str, ...]
    clocks: tuple[str, ...]
    bell: str

    @classmethod
    def of(cls, keys: Keys, model: str, device: str, levels: Iterable[str]) -> FairKeys:
        """The keys of `levels` (in the order the worker reads their streams) for one model and device."""
        levels = tuple(levels)
        return cls(tuple(keys.fair_order(model, device, level) for level in levels),
                   tuple(keys.fair_clock(model, device, level) for level in levels), keys.fair_bell(model, device))


class Intake:
    def __init__(self, redis: aioredis.Redis, consumer: str, *streams: str, aging_s: float = 0.0,
                 fair: FairKeys | None = None) -> None:
        """`streams`: highest level first, the batch stream last. `fair`: read parked jobs too (fair shares)."""
        self.consumer = consumer
        self.streams = streams
        self.aging_ms = int(aging_s * 1000)
        self.fair = fair
        self._keys = [*streams, *fair.orders, *fair.clocks] if fair else list(streams)
        # The blocking read's streams: a parked job rings the bell instead of adding an undelivered entry.
        self._blocking = (*streams, fair.bell) if fair else streams
        # A lane of its own: the blocking read holds its connection for up to `block_ms`.
        self.lane = open_lane(redis)
        self._read = Script(READ)

    @property
    def bells(self) -> tuple[str, ...]:
        """Streams besides the job streams whose consumer group the worker creates."""
        return (self.fair.bell,) if self.fair else ()

    def _read_args(self, count: int) -> list[object]:
        return [GROUP, self.consumer, count, self.aging_ms, len(self.streams) - 1, len(self.streams), PARK]

    async def _take(self, count: int) -> list[tuple[str, Entries]]:
        which, entries, _ = unpack(await self._read(self.lane, keys=self._keys, args=self._read_args(count)))
        return [(self.streams[which - 1], entries)] if which else []

    async def read(self, count: int, block_ms: int) -> list[tuple[str, Entries]]:
        """Up to `count` jobs as (stream, entries), highest level first (an aged one before all); blocks up to
        `block_ms` when every stream is empty. The blocking read takes one entry per stream: rarely, when several
        streams get a job at the same moment, that is a few jobs beyond `count` (the highest level first)."""
        if taken := await self._take(count):
            return taken
        return await self._block(count, block_ms)

    async def _block(self, count: int, block_ms: int, also: tuple[str, ...] = ()) -> list[tuple[str, Entries]]:
        """Wait up to `block_ms` for a job in any of the streams (and `also`'s: more job streams)."""
        blocking = (*self._blocking, *also)
        [reply] = await self.lane.execute([["XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", 1, "BLOCK", block_ms,
                                            "STREAMS", *blocking, *(">" for _ in blocking)]], block_ms / 1000)
        if isinstance(reply, ResponseError):
            if is_unblocked(reply):  # a stream moved to another master (resharding) or was deleted: read again
                return []
            raise reply
        got = {s.decode(): _entries(entries) for s, entries in _by_stream(reply)}
        jobs = [(stream, got[stream]) for stream in (*self.streams, *also) if got.get(stream)]
        if self.fair and (rung := got.get(self.fair.bell)):
            await self.lane.execute([["XACK", self.fair.bell, GROUP, *(entry_id for entry_id, _ in rung)]])
            if not jobs:  # a job was parked: take it (or, when another worker was quicker, nothing)
                return await self._take(count)
        return jobs

    async def close(self) -> None:
        await self.lane.close()


def _by_stream(reply: Any) -> list[tuple[bytes, list]]:
    """XREADGROUP's reply on a lane (RESP2): a list of [stream, entries] pairs, or nil."""
    return [(s, entries) for s, entries in reply or []]
