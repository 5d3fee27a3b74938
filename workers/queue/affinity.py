"""Prefix affinity, the worker's half: its own affinity stream read first, stealing from others' when idle, and the
record of which prefixes it served.

Reading order (`AffineIntake.read`), one source per read as the shared intake does:
1. the worker's affinity stream (`Keys.affinity_jobs`), unless a job of a level above interactive (high) waits in
   the shared streams: affinity jobs are interactive, and keep that level's place;
2. stealing, on the same condition: the oldest undelivered jobs of other workers' affinity streams that have
   waited at least `affinity_steal_ms` (a stream id's milliseconds are its enqueue time, Redis clock): a busy
   or dead worker's jobs start elsewhere, no later than the threshold after a worker has room; before
   the shared interactive jobs (they have waited the threshold already), so before batch lines too;
3. the shared streams as before (`Intake.read`: levels, aging, batch last), without blocking;
4. a blocking read of the shared streams and its own affinity stream together, so it wakes for either.

A draining worker gets no new affinity jobs and hands back those waiting for it at once (`Affinity.drain`).

A stolen job stays an entry of its owner's stream: it is acked there (`Job.affinity` names it), and a thief that
dies leaves it pending there, where any worker's reclaimer takes it over (`Affinity.streams`) by today's rules, dead
letters included. What affinity does not keep: lower levels' aging competes only within the shared streams (an
affinity job is read before an aged low-priority one), and per-tenant shares apply to the shared streams (an
affinity stream is first come, first served).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.jobs import ENTRY_JOB, Job
from common.keys import GROUP, Keys
from common.redis.client import UNAVAILABLE
from common.redis.lane import Lane, Script
from common.settings import Settings
from workers.queue.intake import Entries, FairKeys, Intake, _entries
from workers.vitals import Member

log = logging.getLogger("ovq.affinity")

_LAST_DELIVERED = """
local function waiting(key, last)
  return last and #redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1) > 0
end
local function last_delivered(key)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
  if not ok then return nil end
  for _, group in ipairs(groups) do
    local fields = {}
    for j = 1, #group, 2 do fields[group[j]] = group[j + 1] end
    if fields['name'] == ARGV[1] then return fields['last-delivered-id'] end
  end
  return nil
end
"""

# KEYS: the shared streams above interactive, then the worker's affinity stream. ARGV: group, consumer, count.
# Its affinity jobs, unless one of those streams has an undelivered entry. Returns the entries read ({} for none).
OWN = _LAST_DELIVERED + """
local own = KEYS[#KEYS]
if redis.call('XLEN', own) == 0 then return {} end
for i = 1, #KEYS - 1 do
  if waiting(KEYS[i], last_delivered(KEYS[i])) then return {} end
end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', own, '>')
if reply then return reply[1][2] end
return {}
"""

# KEYS: the shared streams above interactive, then other workers' affinity streams. ARGV: group, consumer, count,
# threshold (ms), how many of KEYS are shared streams. Nothing while a shared one has an undelivered entry; else from
# the first affinity stream whose oldest undelivered entries have waited the threshold: those (up to count).
# Returns {the stream's index (1-based), its entries}, or {0, {}, ms until the first entry waiting reaches the
# threshold (-1: none waits)}.
STEAL = _LAST_DELIVERED + """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local threshold = tonumber(ARGV[4])
local soonest = -1
for i = 1, tonumber(ARGV[5]) do
  if waiting(KEYS[i], last_delivered(KEYS[i])) then return {0, {}, -1} end
end
for i = tonumber(ARGV[5]) + 1, #KEYS do
  if redis.call('XLEN', KEYS[i]) > 0 then
    local last = last_delivered(KEYS[i])
    if last then
      local n = 0
      for _, entry in ipairs(redis.call('XRANGE', KEYS[i], '(' .. last, '+', 'COUNT', ARGV[3])) do
        local left = threshold - (now_ms - tonumber(string.match(entry[1], '^(%d+)')))
        if left > 0 then
          if soonest < 0 or left < soonest then soonest = left end
          break
        end
        n = n + 1
      end
      if n > 0 then
        local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS', KEYS[i], '>')
        if reply then return {i, reply[1][2]} end
      end
    end
  end
end
return {0, {}, soonest}
"""

# KEYS: the draining workers zset, the worker's affinity stream, its device's shared interactive stream.
# ARGV: group, worker id, now (unix s), job TTL. The worker says it drains (the API's ENQUEUE then passes it over)
# and, in the same step, moves its undelivered affinity jobs to the shared stream (their `affinity` cleared: whoever
# reads them there acks them there). Returns how many it moved.
DRAIN = _LAST_DELIVERED + f"""
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[4]))
redis.call('EXPIRE', KEYS[1], ARGV[4])
local last = last_delivered(KEYS[2]) or '0-0'
local entries = redis.call('XRANGE', KEYS[2], '(' .. last, '+')
local mine = '"affinity":"' .. ARGV[2] .. '"'
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for j = 1, #fields, 2 do
    if fields[j] == '{ENTRY_JOB}' then
      local at, to = string.find(fields[j + 1], mine, 1, true)
      if at then
        fields[j + 1] = string.sub(fields[j + 1], 1, at - 1) .. '"affinity":null' .. string.sub(fields[j + 1], to + 1)
      end
    end
  end
  redis.call('XADD', KEYS[3], '*', unpack(fields))
  redis.call('XDEL', KEYS[2], entry[1])
end
return #entries
"""


class Affinity:
    """One worker's affinity state: its stream, the others' (to steal from and reclaim), its counts."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings, member: Member) -> None:
        self.redis, self.keys, self.settings, self.member = redis, keys, settings, member
        self.stream = keys.affinity_jobs(member.model, member.device, member.id)
        levels = [level for level, _ in member.levels]
        top = levels.index("interactive") if "interactive" in levels else 0
        self.above = [stream for _, stream in member.levels[:top]]  # shared streams read before affinity jobs
        self.others: list[str] = []  # other workers' affinity streams, as of the last heartbeat
        self.hits = 0  # jobs run from its own affinity stream
        self.steals = 0  # jobs run from another worker's
        self.recorded = 0  # jobs whose prefixes it recorded
        self._own = Script(OWN)
        self._steal = Script(STEAL)
        self._tasks: set[asyncio.Task[None]] = set()
        self.next_steal_ms = -1  # after a steal that found nothing: when the first job waiting may be stolen
        self.draining = False  # it records no prefixes any more: the API should not prefer it

    @property
    def streams(self) -> tuple[str, ...]:
        """Every affinity stream of its model and device it knows: its own first (what its reclaimer covers)."""
        return self.stream, *self.others

    async def own(self, lane: Lane, count: int) -> Entries:
        raw = await self._own(lane, keys=[*self.above, self.stream], args=[GROUP, self.member.id, count])
        return _entries(raw)

    async def steal(self, lane: Lane, count: int) -> tuple[str, Entries] | None:
        """Others' jobs that waited the threshold; else None, and `next_steal_ms` says when one will have."""
        self.next_steal_ms = -1
        if not self.others:
            return None
        victims = random.sample(self.others, len(self.others))  # thieves spread over the busy workers
        which, raw, *soonest = await self._steal(lane, keys=[*self.above, *victims],
                                                 args=[GROUP, self.member.id, count, self.settings.affinity_steal_ms,
                                                       len(self.above)])
        if which:
            return victims[which - 1 - len(self.above)], _entries(raw)
        self.next_steal_ms = int(soonest[0]) if soonest else -1
        return None

    async def beat(self) -> None:
        """With each heartbeat: say it has a stream (and keep it), learn the others'."""
        m, ttl = self.member, self.settings.job_ttl_s
        owners = self.keys.affinity_owners(m.model, m.device)
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(owners, {m.id: now})
        pipe.zremrangebyscore(owners, "-inf", now - ttl)
        pipe.expire(owners, ttl)
        pipe.expire(self.stream, ttl)
        pipe.zrangebyscore(owners, "-inf", "+inf")
        # Beside the heartbeat's fields, for the ops page (the heartbeat just wrote the hash and its TTL).
        pipe.hset(self.keys.worker(m.id), mapping={"affinity_hits": self.hits, "affinity_steals": self.steals})
        pipe.pexpire(self.keys.worker(m.id), int(self.settings.worker_ttl_s * 1000))
        *_, members, _, _ = await pipe.execute()
        self.others = [self.keys.affinity_jobs(m.model, m.device, w.decode()) for w in members
                       if w.decode() != m.id]

    async def drain(self) -> int:
        """It drains: no new affinity jobs for it, and those waiting for it go back to the shared stream (DRAIN),
        where any worker takes them now rather than after the steal threshold. Returns how many moved."""
        self.draining = True
        m = self.member
        shared = dict(m.levels).get("interactive", m.stream)
        keys = [self.keys.affinity_draining(m.model, m.device), self.stream, shared]
        moved = int(await self.redis.eval(DRAIN, len(keys), *keys, GROUP, m.id, time.time(), self.settings.job_ttl_s))
        if moved:
            log.info("draining: %d affinity jobs back to the shared stream", moved)
        return moved

    def served(self, jobs: list[Job]) -> None:
        """Jobs it starts: count where they came from, and record their prefixes as served here (in the
        background: a lost record only costs a later job its affinity)."""
        mine = f"{self.member.device}|{self.member.id}"
        digests = []
        for job in jobs:
            if job.affinity == self.member.id:
                self.hits += 1
            elif job.affinity:
                self.steals += 1
            if job.prefixes and not self.draining:
                digests += job.prefixes
                self.recorded += 1
        if not digests:
            return
        task = asyncio.create_task(self._record(digests, mine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, digests: list[str], mine: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for digest in dict.fromkeys(digests):
            pipe.set(self.keys.prefix_owner(self.member.model, digest), mine, ex=self.settings.affinity_ttl_s)
        try:
            await pipe.execute()
        except (*UNAVAILABLE, ResponseError) as exc:
            log.debug("prefix record lost: %s", exc)


class AffineIntake(Intake):
    """The shared intake with a worker's affinity stream before it and stealing after it (see the module)."""

    def __init__(self, redis: aioredis.Redis, consumer: str, *streams: str, aging_s: float = 0.0,
                 fair: FairKeys | None = None, affinity: Affinity) -> None:
        super().__init__(redis, consumer, *streams, aging_s=aging_s, fair=fair)
        self.affinity = affinity

    async def read(self, count: int, block_ms: int) -> list[tuple[str, Entries]]:
        own = await self.affinity.own(self.lane, count)
        if own:
            return [(self.affinity.stream, own)]
        stolen = await self.affinity.steal(self.lane, count)
        if stolen is not None:
            return [stolen]
        if shared := await self._take(count):
            return shared
        if self.affinity.next_steal_ms >= 0:  # wake when a job waiting elsewhere may be stolen
            block_ms = max(1, min(block_ms, self.affinity.next_steal_ms + 1))
        return await self._block(count, block_ms, (self.affinity.stream,))
