"""Prefix affinity, the worker's half: its own affinity stream read first, stealing from others' when idle, and the
record of which prefixes it served.

Reading order (`AffineIntake.read`), one source per read as the shared intake does:
1. the worker's affinity stream (`Keys.affinity_jobs`), unless a job of the shared streams goes before its first
   job (OWN's `yields`): a job of a level above interactive (affinity jobs are interactive, and keep that level's
   place); a lower level's job aged past it (`OVQ_PRIORITY_AGING_S`, ranked as the intake ranks levels); a parked
   job of the interactive level with an earlier virtual start (fair shares: the API tags a tenant's affinity job
   with its virtual start in the level's clock, and queues it in the shared stream instead when it would run
   before jobs already waiting in that worker's stream, so a stream is in fair order);
2. stealing, on the same condition: the oldest undelivered jobs of other workers' affinity streams that have
   waited at least `affinity_steal_ms` (a stream id's milliseconds are its enqueue time, Redis clock): a busy
   or dead worker's jobs start elsewhere, no later than the threshold after a worker has room; before
   the shared interactive jobs without a tenant (they have waited the threshold already), so before batch lines too;
3. the shared streams as before (`Intake.read`: levels, aging, fair order, batch last), without blocking;
4. a blocking read of the shared streams and its own affinity stream together, so it wakes for either.

So a tenant whose flood is pinned to one worker by its `prompt_cache_key` does not pass other tenants' jobs there,
and aging bounds a low-priority job's wait on a worker with affinity jobs as on any other.

A draining worker gets no new affinity jobs and hands back those waiting for it at once (`Affinity.drain`).

A stolen job stays an entry of its owner's stream: it is acked there (`Job.affinity` names it), and a thief that
dies leaves it pending there, where any worker's reclaimer takes it over (`Affinity.streams`) by today's rules, dead
letters included.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.fairness import START_OF
from common.jobs import ENTRY_JOB, Job
from common.keys import GROUP, Keys
from common.redis.client import UNAVAILABLE
from common.redis.lane import Lane, Script
from common.settings import Settings
from workers.queue.intake import OLDEST_WAITING, PACK, Entries, FairKeys, Intake, unpack
from workers.vitals import Member

log = logging.getLogger("ovq.affinity")

# The intake's READ keys and args (workers/queue/intake.py), which the affinity reads weigh their jobs against.
SharedRead = tuple[list[str], list[object]]

_LAST_DELIVERED = """
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

# What the affinity reads share. KEYS: the intake's (workers/queue/intake.py READ's: the level streams, then with
# fair shares each level's order set and clock), then affinity streams. ARGV: READ's seven (group, consumer, count,
# aging ms, streams aged, streams, parking consumer), then the interactive level's index (1-based), how many KEYS
# are the intake's.
# `yields(t, s)`: whether a job of the shared streams goes before an affinity job queued at `t` (ms) with virtual
# start `s` (nil: no tenant): any job of a higher level; a lower level's job that aged past it (READ's ranks, a tie
# to the higher level); a parked job of its level with an earlier virtual start (fair shares span both kinds of
# stream). `first_parked()`: that level's lowest virtual start. `started(entries)`: taking them moves the level's
# virtual time on, as taking a parked job does.
_SHARED = _LAST_DELIVERED + """
local n, lvl, base = tonumber(ARGV[6]), tonumber(ARGV[8]), tonumber(ARGV[9])
local fair = base > n
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
""" + OLDEST_WAITING + START_OF + """
local function first_parked()
  if not fair then return nil end
  local first = redis.call('ZRANGE', KEYS[n + lvl], 0, 0, 'WITHSCORES')
  if #first > 0 then return tonumber(first[2]) end
  return nil
end
local function yields(t, s)
  for i = 1, lvl - 1 do
    if redis.call('XLEN', KEYS[i]) > 0 and oldest_waiting(i) then return true end
  end
  local aging = tonumber(ARGV[4])
  if aging > 0 then
    local rank = lvl - math.floor((now_ms - t) / aging)
    for i = lvl + 1, tonumber(ARGV[5]) do
      local oldest = redis.call('XLEN', KEYS[i]) > 0 and oldest_waiting(i)
      if oldest and i - math.floor((now_ms - oldest) / aging) < rank then return true end
    end
  end
  local parked = first_parked()
  return s ~= nil and parked ~= nil and parked < s
end
-- How many of `entries` (undelivered, oldest first) to take: the run from the first that no parked job goes before.
local function run_of(entries)
  local parked, k = first_parked(), 0
  for _, entry in ipairs(entries) do
    local s = start_of(entry[2])
    if s and parked and parked < s then break end
    k = k + 1
  end
  return k
end
local function started(entries)
  if not fair then return end
  local top = nil
  for _, entry in ipairs(entries) do
    local s = start_of(entry[2])
    if s and (top == nil or s > top) then top = s end
  end
  local clock = KEYS[2 * n + lvl]
  if top and top > tonumber(redis.call('HGET', clock, 'v') or '0') then redis.call('HSET', clock, 'v', top) end
end
"""

# KEYS, ARGV: _SHARED's; the one affinity stream is the worker's own. Its undelivered jobs from the first, unless a
# shared job goes before it (`yields`). Returns the entries read (none for none), packed (workers/queue/intake.py PACK).
OWN = _SHARED + PACK + """
local own = KEYS[base + 1]
if redis.call('XLEN', own) == 0 then return pack(0, {}) end
local waiting = redis.call('XRANGE', own, '(' .. (last_delivered(own) or '0-0'), '+', 'COUNT', ARGV[3])
if #waiting == 0 or yields(id_ms(waiting[1][1]), start_of(waiting[1][2])) then return pack(0, {}) end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', run_of(waiting), 'STREAMS', own, '>')
if not reply then return pack(0, {}) end
started(reply[1][2])
return pack(1, reply[1][2])
"""

# KEYS, ARGV: _SHARED's, then the threshold (ms); the affinity streams are other workers'. From the first stream
# whose oldest undelivered entries have waited the threshold: those (up to count), unless a shared job goes before
# the first (`yields`: then none, and the intake's READ takes that job).
# Returns, packed (workers/queue/intake.py PACK), the stream's index among the affinity streams (1-based) and its
# entries, or 0, none and the ms until the first entry waiting reaches the threshold (-1: none waits, or a shared job
# goes first).
STEAL = _SHARED + PACK + """
local threshold = tonumber(ARGV[10])
local soonest = -1
for i = base + 1, #KEYS do
  if redis.call('XLEN', KEYS[i]) > 0 then
    local last = last_delivered(KEYS[i])
    if last then
      local ready = {}
      for _, entry in ipairs(redis.call('XRANGE', KEYS[i], '(' .. last, '+', 'COUNT', ARGV[3])) do
        local left = threshold - (now_ms - id_ms(entry[1]))
        if left > 0 then
          if soonest < 0 or left < soonest then soonest = left end
          break
        end
        ready[#ready + 1] = entry
      end
      if #ready > 0 then
        if yields(id_ms(ready[1][1]), start_of(ready[1][2])) then return pack(0, {}, -1) end
        local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', run_of(ready), 'STREAMS', KEYS[i],
                                 '>')
        if reply then
          started(reply[1][2])
          return pack(i - base, reply[1][2])
        end
      end
    end
  end
end
return pack(0, {}, soonest)
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
        self.level = levels.index("interactive") + 1 if "interactive" in levels else 1  # its jobs' level (1-based)
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

    async def own(self, lane: Lane, shared: SharedRead) -> Entries:
        """Its own stream's jobs, unless a job of the shared streams goes first (OWN)."""
        keys, args = shared
        raw = await self._own(lane, keys=[*keys, self.stream], args=[*args, self.level, len(keys)])
        return unpack(raw)[1]

    async def steal(self, lane: Lane, shared: SharedRead) -> tuple[str, Entries] | None:
        """Others' jobs that waited the threshold, unless a job of the shared streams goes first; else None, and
        `next_steal_ms` says when one will have (-1: none waits)."""
        self.next_steal_ms = -1
        if not self.others:
            return None
        victims = random.sample(self.others, len(self.others))  # thieves spread over the busy workers
        keys, args = shared
        which, entries, soonest = unpack(await self._steal(
            lane, keys=[*keys, *victims], args=[*args, self.level, len(keys), self.settings.affinity_steal_ms]))
        if which:
            return victims[which - 1], entries
        self.next_steal_ms = soonest
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
        shared = (self._keys, self._read_args(count))
        own = await self.affinity.own(self.lane, shared)
        if own:
            return [(self.affinity.stream, own)]
        stolen = await self.affinity.steal(self.lane, shared)
        if stolen is not None:
            return [stolen]
        if shared := await self._take(count):
            return shared
        if self.affinity.next_steal_ms >= 0:  # wake when a job waiting elsewhere may be stolen
            block_ms = max(1, min(block_ms, self.affinity.next_steal_ms + 1))
        return await self._block(count, block_ms, (self.affinity.stream,))
