"""Which models exist, what they accept, and which device stream a new job goes to."""
from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import redis.asyncio as aioredis

from api.queue import affinity
from api.queue.tenant import Quotas
from common.errors import OvqError, not_found, unavailable
from common.fairness import BELL_LEN, CLOCK_CAP, PARK, in_flight
from common.jobs import ENTRY_JOB, LEVELS, Job, JobHash, JobStatus
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.ops.cluster import affinity_waiting
from common.ops.stats import OUTCOMES, WINDOW_S, window_of
from common.redis.client import UNAVAILABLE, replicas_wanted
from common.redis.cluster import open_lane
from common.redis.lane import Command, Script
from common.redis.replicas import ReplicaWait
from common.settings import Settings

CARD_CACHE_S = 1.0


# KEYS: job hash, then per device (in preference order): its workers zset, its (interactive) stream, the stream
# of the job's priority level (`Keys.level_jobs`: the same, its batch stream, or its high or low stream), that
# level's fair order set and clock, and the device's bell (common/fairness.py).
# ARGV: oldest live heartbeat, max backlog, job TTL, created, reply_to, model, priority, tenant ('' when the job
# carries none: not parked), its cost over its weight, then per device its name and the job as JSON. An
# interactive job goes to the device with the fewest interactive jobs (batch jobs never delay it: workers read
# them only when no interactive job waits); a batch job to the device with the fewest jobs of either kind (a job
# of another level: by the interactive backlog plus its own level's). With no live worker on any device
# (restarting, or scaled to zero) the job still goes in, by the same rule over every device, and waits there for
# a worker (the API bounds that wait: `queue_timeout_s`). A job with a tenant is then parked (common/fairness.py)
# with every undelivered entry of its stream (the others as tenant '', at `v`: first), and the bell rings.
# Returns one string, 'device live entry parked': the device chosen (1-based), 1 when it has a live worker else 0,
# the stream entry's id, 1 when parked ('-1' when the chosen backlog is full). Not a table: Redis 6.2 writes each
# table a script returns in a write(2) of its own, a syscall per job (workers/queue/intake.py PACK).
ENQUEUE = f"""
local per = 6
local devices = (#KEYS - 1) / per
local function shortest(live_only)
  local best, best_len = 0, 0
  for i = 1, devices do
    local k = per * (i - 1) + 1
    if not live_only or redis.call('ZCOUNT', KEYS[k + 1], ARGV[1], '+inf') > 0 then
      local len = redis.call('XLEN', KEYS[k + 2])
      if KEYS[k + 3] ~= KEYS[k + 2] then len = len + redis.call('XLEN', KEYS[k + 3]) end
      if best == 0 or len < best_len then best, best_len = i, len end
    end
  end
  return best, best_len
end
local live = 1
local best, best_len = shortest(true)
if best == 0 then
  live = 0
  best, best_len = shortest(false)
end
if best_len >= tonumber(ARGV[2]) then return '-1' end
local k = per * (best - 1) + 1
redis.call('HSET', KEYS[1], '{JobHash.STATUS}', '{JobStatus.QUEUED}', '{JobHash.CREATED}', ARGV[4],
           '{JobHash.API}', ARGV[5], '{JobHash.MODEL}', ARGV[6], '{JobHash.DEVICE}', ARGV[8 + 2 * best])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local stream, order, clock, bell = KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], KEYS[k + 6]
local id = redis.call('XADD', stream, '*', '{ENTRY_JOB}', ARGV[9 + 2 * best])
if ARGV[8] == '' then return best .. ' ' .. live .. ' ' .. id .. ' 0' end
local ok, read = pcall(redis.call, 'XREADGROUP', 'GROUP', '{GROUP}', '{PARK}', 'COUNT', ARGV[2], 'STREAMS', stream, '>')
if not ok or not read then return best .. ' ' .. live .. ' ' .. id .. ' 0' end
local v = tonumber(redis.call('HGET', clock, 'v') or '0')
for _, entry in ipairs(read[1][2]) do
  if entry[1] == id then
    local start = math.max(v, tonumber(redis.call('HGET', clock, 'f:' .. ARGV[8]) or '0'))
    redis.call('HSET', clock, 'f:' .. ARGV[8], start + tonumber(ARGV[9]))
    redis.call('ZADD', order, start, id .. '|' .. ARGV[8])
    redis.call('HINCRBY', clock, 'n:' .. ARGV[8], 1)
  else
    redis.call('ZADD', order, v, entry[1] .. '|')
    redis.call('HINCRBY', clock, 'n:', 1)
  end
end
if redis.call('HLEN', clock) > {CLOCK_CAP} then
  local fields = redis.call('HGETALL', clock)
  for j = 1, #fields, 2 do
    if string.sub(fields[j], 1, 2) == 'f:' and tonumber(fields[j + 1]) <= v then
      redis.call('HDEL', clock, fields[j])
    end
  end
end
redis.call('EXPIRE', clock, ARGV[3])
redis.call('XADD', bell, 'MAXLEN', {BELL_LEN}, '*', 'r', '1')
return best .. ' ' .. live .. ' ' .. id .. ' 1'
"""
# KEYS: the stream, the job hash, the level's fair order set and clock. ARGV: the entry's id, its tenant when it
# was parked (else nothing). Takes back a job no worker has taken yet (still `queued`): nobody runs it later, and a
# scaler reading the stream's length no longer counts it. Its hash says `cancelled`, as a worker that skipped it
# would have written. A parked job leaves its order set and the parking consumer's pending list too.
WITHDRAW = f"""
if redis.call('HGET', KEYS[2], '{JobHash.STATUS}') == '{JobStatus.QUEUED}' then
  redis.call('HSET', KEYS[2], '{JobHash.STATUS}', '{JobStatus.CANCELLED}')
  if ARGV[2] and redis.call('ZREM', KEYS[3], ARGV[1] .. '|' .. ARGV[2]) == 1 then
    redis.call('XACK', KEYS[1], '{GROUP}', ARGV[1])
    if redis.call('HINCRBY', KEYS[4], 'n:' .. ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[4], 'n:' .. ARGV[2]) end
  end
  return redis.call('XDEL', KEYS[1], ARGV[1])
end
return 0
"""
CARD_POLL_S = 0.5
ESTIMATE_CACHE_S = 0.5
ESTIMATES_KEPT = 1024  # a burst's requests share one wait estimate (one round trip)
RATE_WINDOWS = 3  # the stats windows (common/ops/stats.py) a wait estimate's rate is measured over


@dataclass
class Queued:
    """Where a job went: its device, its stream entry, and whether a live worker served that device then."""
    device: str
    stream: str
    entry: str
    live: bool
    # Where a parked job's fair order is kept (common/fairness.py): its order set, clock and tenant; None: not parked.
    parked: tuple[str, str, str] | None = None


@dataclass
class Servable:
    model: str
    cards: dict[str, ModelCard]

    @property
    def card(self) -> ModelCard:
        """The first announced device's card: what requests are validated and rendered with."""
        return next(iter(self.cards.values()))

    @property
    def prefix_caching(self) -> bool:
        """Some device's engines cache prompt prefixes (what OVQ_AFFINITY=auto turns affinity on for)."""
        return any(card.prefix_caching for card in self.cards.values())


class Registry:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings, expected: list[str],
                 devices: dict[str, list[str]] | None = None, configured: bool = False) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self.expected = expected
        self.devices = devices or {}  # an expected model's devices in the models file, in preference order
        # The models file says which models exist: one it does not name is a 404 even while its workers still
        # announce it (a removed model's workers drain). Without one, every announced model is served.
        self.configured = configured
        self.removed: set[str] = set()  # models a reload took out of the models file (`apply`)
        self._cards: dict[str, tuple[float, dict[str, ModelCard]]] = {}
        self._adapters: dict[str, tuple[float, list[str]]] = {}
        self._loading: dict[str, asyncio.Future[dict[str, ModelCard]]] = {}
        self._estimates: dict[tuple[str, str, str | None], tuple[float, float | None]] = {}
        self._estimating: dict[tuple[str, str, str | None], asyncio.Future[float | None]] = {}
        self._enqueue = Script(ENQUEUE)
        self._withdraw = Script(WITHDRAW)
        self._affine_enqueue = Script(affinity.ENQUEUE)
        # Every request's enqueue, on a connection of its own: those made in one event-loop turn go out in one
        # write (a burst of requests costs Redis and this process a few writes).
        self._lane = open_lane(redis)
        self.quotas = Quotas(self._lane, keys)
        wanted = replicas_wanted(settings)
        self._replicas = ReplicaWait(wanted, settings.redis_wait_timeout_ms) if wanted else None

    async def cards(self, model: str) -> dict[str, ModelCard]:
        """Device -> card, as the model's workers last announced it (cached for a second; concurrent misses
        share one read, so a burst costs Redis one HGETALL, not one per request)."""
        cached = self._cards.get(model)
        if cached and time.monotonic() - cached[0] < CARD_CACHE_S:
            return cached[1]
        loading = self._loading.get(model)
        if loading is None:
            loading = self._loading[model] = asyncio.ensure_future(self._load(model))
            loading.add_done_callback(lambda _: self._loading.pop(model, None))
        return await asyncio.shield(loading)

    async def _load(self, model: str) -> dict[str, ModelCard]:
        raw = await self.redis.hgetall(self.keys.model(model))
        parsed = [ModelCard.model_validate_json(v) for v in raw.values()]
        cards = {c.device: c for c in sorted(parsed, key=lambda c: (c.preference, c.device))}
        if cards:  # no negative caching: a worker that has just started is served at once
            self._cards[model] = (time.monotonic(), cards)
        return cards

    def apply(self, expected: list[str], devices: dict[str, list[str]]) -> None:
        """A reloaded models file: these models exist now, on these devices (api/ops/config.py)."""
        for gone in set(self.expected) - set(expected):
            self._cards.pop(gone, None)
            self.removed.add(gone)
        self.removed -= set(expected)
        self.expected, self.devices = expected, devices

    def exists(self, model: str) -> bool:
        """Not known to be gone: a model a reload took out of the models file is (a 404 at once, while its workers
        drain); any other is as its cards and the file say (a worker may announce a model the file does not name)."""
        return not (self.configured and model in self.removed)

    async def runtime_adapters(self, model: str, fresh: bool = False) -> list[str]:
        """The LoRA adapters loaded onto the model at run time (`Keys.lora`), cached as the cards are."""
        cached = self._adapters.get(model)
        if cached and not fresh and time.monotonic() - cached[0] < CARD_CACHE_S:
            return cached[1]
        names = sorted(n.decode() if isinstance(n, bytes) else n for n in await self.redis.hkeys(self.keys.lora(model)))
        self._adapters[model] = (time.monotonic(), names)
        return names

    def forget_adapters(self, model: str) -> None:
        """This process changed the model's adapters: its next read goes to Redis."""
        self._adapters.pop(model, None)

    async def adapters(self, model: str, card: ModelCard | None) -> list[str]:
        """Every adapter a request may name on the model: the models file's (its card) and those loaded since."""
        static = card.adapters if card is not None else []
        return sorted({*static, *await self.runtime_adapters(model)})

    async def announced(self) -> list[str]:
        """Models with a worker heard within the card TTL."""
        since = time.time() - self.settings.model_card_ttl_s
        return [m.decode() for m in await self.redis.zrangebyscore(self.keys.models, since, "+inf")]

    async def models(self) -> dict[str, ModelCard | None]:
        names = set(await self.announced()) | set(self.expected)
        listed: dict[str, ModelCard | None] = {}
        for name in sorted(n for n in names if self.exists(n)):
            cards = await self.cards(name)
            if cards or name in self.expected:
                listed[name] = next(iter(cards.values()), None)
        return listed

    async def live_workers(self, model: str, devices: list[str]) -> dict[str, int]:
        since = time.time() - self.settings.worker_ttl_s
        pipe = self.redis.pipeline(transaction=False)
        for device in devices:
            pipe.zcount(self.keys.workers(model, device), since, "+inf")
        return dict(zip(devices, await pipe.execute(), strict=False))

    async def servable(self, model: str, since: float | None = None) -> Servable:
        """The model's announced cards; 404 at once for a model nobody announced and nobody expects.

        An expected model with no card yet (its workers have never announced, or not within the card TTL) waits
        for one, up to `queue_timeout_s` after `since` (time.monotonic(), the request's start: the same bound
        its job's wait for a worker has), then 503: requests are validated and rendered with the card."""
        if not self.exists(model):
            raise not_found(f"The model `{model}` does not exist")
        cards = await self.cards(model)
        if cards:
            return Servable(model, cards)
        if model not in self.expected:
            raise not_found(f"The model `{model}` does not exist")
        timeout = self.settings.queue_timeout_s
        until = (time.monotonic() if since is None else since) + timeout
        async with self._awaiting(model):
            while not cards:
                if time.monotonic() >= until:
                    raise unavailable(f"No worker of `{model}` came up within {timeout:.0f}s (queue_timeout_s)")
                await asyncio.sleep(CARD_POLL_S)
                cards = await self.cards(model)
        return Servable(model, cards)

    @asynccontextmanager
    async def _awaiting(self, model: str) -> AsyncIterator[None]:
        """While inside: this request counts in the model's `awaiting` list on its first models-file device (what
        wakes a scaled-to-zero worker: no job can be queued before a card). The key outlives the longest wait by a
        minute, so an API process that dies mid-wait leaves nothing behind for long."""
        devices = self.devices.get(model)
        if not devices:
            yield
            return
        key, token = self.keys.awaiting(model, devices[0]), uuid.uuid4().hex
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(key, token)
        pipe.expire(key, math.ceil(self.settings.queue_timeout_s) + 60)
        await pipe.execute()
        try:
            yield
        finally:
            with suppress(*UNAVAILABLE):  # Redis away: the key's expiry cleans up
                await asyncio.shield(self.redis.lrem(key, 1, token))

    async def awaiting(self, model: str) -> bool:
        """An expected model with no card (yet): `servable` would wait for one."""
        return model in self.expected and not await self.cards(model)

    async def enqueue(self, servable: Servable, job: Job, owner: str | None = None) -> Queued:
        """Put the job on the live device stream with the shortest backlog, in one atomic round trip: the
        device's stream of the job's priority level (`Keys.level_jobs`). With no live worker on any device,
        on the device stream with the shortest backlog all the same, to wait for one.

        Returns where it went; 429 when the chosen backlog is full.

        With prefix affinity on (`affinity`), a job that carries prefix digests goes to the affinity stream of the
        live worker that last served its longest recorded prefix, when there is one (api/queue/affinity.py).

        `owner`: whose a resumable stream's job is (common/owner.py), recorded in its hash in the same round trip.
        """
        if self.settings.affinity_on(servable.prefix_caching) and job.prefixes and affinity.eligible(job):
            queued = await self._affine(servable, job, owner)
            if queued is not None:
                return queued
            job.affinity = None
        devices = list(servable.cards)
        level, model = job.priority, servable.model
        keys = [k for d in devices for k in (
            self.keys.workers(model, d), self.keys.jobs(model, d), self.keys.level_jobs(model, d, level),
            self.keys.fair_order(model, d, level), self.keys.fair_clock(model, d, level),
            self.keys.fair_bell(model, d))]
        jobs = []
        for device in devices:  # the job as each device's worker would get it; `device` ends as the chosen one
            job.device = device
            jobs.append((device, job.to_json()))
        since = time.time() - self.settings.worker_ttl_s
        share = job.share  # (a batch line has one when it runs as its batch's owner: api/batch/lines.py)
        args = [since, self.settings.max_queue_depth, self.settings.job_ttl_s, job.created, job.reply_to,
                model, level, share.tenant if share else "", share.cost / share.weight if share else 0,
                *(part for pair in jobs for part in pair)]
        touched = [self.keys.job(job.id, job.model), *keys]
        before = self._reader_lease(job, owner)
        reply = await (self._enqueue(self._lane, touched, args, before) if self._replicas is None
                       else self._replicas.run(self._lane, self._enqueue, touched, args, before))
        if reply == b"-1":
            raise OvqError(f"The model `{model}` is overloaded; retry later", 429, "rate_limit_error",
                           code="queue_full")
        chosen, live, entry, parked = reply.decode().split(" ")
        job.device = devices[int(chosen) - 1]
        at = 6 * (int(chosen) - 1)
        return Queued(job.device, keys[at + 2], entry, live == "1",
                      (keys[at + 3], keys[at + 4], share.tenant) if parked == "1" and share else None)

    def _reader_lease(self, job: Job, owner: str | None = None) -> list[Command]:
        """A resumable stream's job goes out with its reader lease (`Keys.reader`: this process reads it, the
        worker checks) and its owner in its hash (who may resume it: api/openai/resume.py), set just ahead of the
        enqueue in its round trip rather than in one of its own; the hash has the job's TTL from there on."""
        if not job.journal or job.background:
            return []
        ttl = max(1, round(self.settings.resume_grace_s))
        lease: list[Command] = [["SET", self.keys.reader(job.id, job.model), job.reply_to, "EX", ttl]]
        if owner is None:
            return lease
        key = self.keys.job(job.id, job.model)
        return [*lease, ["HSET", key, JobHash.OWNER, owner], ["EXPIRE", key, self.settings.job_ttl_s]]

    async def _affine(self, servable: Servable, job: Job, owner: str | None = None) -> Queued | None:
        """Into the preferred worker's affinity stream (two round trips: who served the prefixes, then the
        enqueue); None when no live worker with room in its stream served any of them."""
        digests = job.prefixes or []
        owners = await self._lane.execute([["MGET", *(self.keys.prefix_owner(servable.model, d) for d in digests)]])
        if not isinstance(owners[0], list):
            return None
        found = affinity.candidates(owners[0], list(servable.cards))
        if not found:
            return None
        since = time.time() - self.settings.worker_ttl_s
        touched, args = affinity.enqueue_args(self.keys, job, found, since, self.settings.affinity_max_waiting,
                                              self.settings.job_ttl_s)
        before = self._reader_lease(job, owner)
        reply = await (self._affine_enqueue(self._lane, touched, args, before) if self._replicas is None
                       else self._replicas.run(self._lane, self._affine_enqueue, touched, args, before))
        which, _, entry = reply.decode().partition(" ")
        if which == "0":
            return None
        at = int(which)
        chosen = found[at - 1]
        job.device, job.affinity = chosen.device, chosen.worker
        return Queued(chosen.device, touched[4 * at - 2], entry, True)

    async def wait_estimate(self, servable: Servable, priority: str, tenant: str | None = None) -> float | None:
        """Seconds a job queued now would wait before a worker starts it: the jobs waiting ahead of it (at its
        priority or above, on every device of the model) over the rate the model's workers finished jobs in the
        last stats windows. With a `tenant` (fair shares, common/fairness.py), of its own level only the jobs
        without a tenant and the parked ones that start before the tenant's next would. 0 when none waits; None
        when some wait but none finished lately: no measure, and nothing is refused on a guess. Cached for half a
        second; concurrent misses share one round trip."""
        key = (servable.model, priority, tenant)
        cached = self._estimates.get(key)
        if cached and time.monotonic() - cached[0] < ESTIMATE_CACHE_S:
            return cached[1]
        estimating = self._estimating.get(key)
        if estimating is None:
            estimating = self._estimating[key] = asyncio.ensure_future(self._estimate(servable, priority, tenant))
            estimating.add_done_callback(lambda _: self._estimating.pop(key, None))
        estimate = await asyncio.shield(estimating)
        if len(self._estimates) > ESTIMATES_KEPT:  # one per tenant too: any number of `user` values
            self._estimates.clear()
        self._estimates[key] = (time.monotonic(), estimate)
        return estimate

    async def _estimate(self, servable: Servable, priority: str, tenant: str | None = None) -> float | None:
        now = time.time()
        windows = [window_of(now) - WINDOW_S * i for i in range(RATE_WINDOWS)]
        fair = tenant is not None
        # On the lane, not a redis-py pipeline: the pipeline's Python costs about a millisecond per estimate.
        commands: list[Command] = []
        for device in servable.cards:
            for stream in self.ahead(servable.model, device, priority):
                commands += [["XLEN", stream], ["XPENDING", stream, GROUP]]  # summary: [count, first, last, ...]
            if fair:
                commands.append(["HMGET", self.keys.fair_clock(servable.model, device, priority), "v", f"f:{tenant}"])
            commands += [["HMGET", self.keys.stats(servable.model, device, window), *OUTCOMES] for window in windows]
        replies = await self._lane.execute(commands)
        waiting, finished, at = 0, 0, 0
        for device in servable.cards:
            own = 0
            for _ in self.ahead(servable.model, device, priority):
                length, pending = replies[at], replies[at + 1]
                at += 2
                if isinstance(length, int) and isinstance(pending, list):
                    own = max(length - in_flight(pending), 0)
                    waiting += own
            if fair:
                clock = replies[at]
                at += 1
                if isinstance(clock, list) and own:  # its level: only what would start before it
                    start = max(float(clock[0] or 0), float(clock[1] or 0))
                    order = self.keys.fair_order(servable.model, device, priority)
                    waiting -= await self.redis.zcount(order, f"({start}", "+inf")
            for _ in windows:
                if isinstance(replies[at], list):
                    finished += sum(int(n) for n in replies[at] if n is not None)
                at += 1
        behind_interactive = priority not in LEVELS or LEVELS.index(priority) >= LEVELS.index("interactive")
        if behind_interactive and self.settings.affinity_on(servable.prefix_caching):
            # Interactive jobs waiting for a preferred worker are ahead of it as well (at most
            # OVQ_AFFINITY_MAX_WAITING per worker: a round trip or two, and only where affinity applies).
            waiting += sum(await affinity_waiting(self.redis, self.keys, self.settings.job_ttl_s,
                                                  [(servable.model, device) for device in servable.cards]))
        if waiting <= 0:
            return 0.0
        seconds = WINDOW_S * (RATE_WINDOWS - 1) + max(now - windows[0], 1.0)
        return waiting * seconds / finished if finished else None

    def ahead(self, model: str, device: str, priority: str) -> list[str]:
        """The streams whose waiting jobs a worker of the device takes before a new job of `priority`: its level's
        and those above (aging aside)."""
        levels = LEVELS[:LEVELS.index(priority) + 1] if priority in LEVELS else LEVELS
        return [self.keys.level_jobs(model, device, level) for level in levels]

    async def withdraw(self, queued: Queued, job_id: str, model: str = "") -> bool:
        """Take a job back out of its stream if no worker has taken it yet (its wait for one timed out)."""
        order, clock, tenant = queued.parked or (queued.stream, queued.stream, None)
        return bool(await self._withdraw(self._lane, keys=[queued.stream, self.keys.job(job_id, model), order, clock],
                                         args=[queued.entry] if tenant is None else [queued.entry, tenant]))

    async def close(self) -> None:
        await self._lane.close()

    async def ready(self) -> dict[str, bool]:
        """Each known model (expected or announced): whether a live worker serves it now."""
        names = sorted(n for n in set(self.expected) | set(await self.announced()) if self.exists(n))
        return {name: bool(await self.served(name)) for name in names}

    async def served(self, model: str) -> bool | None:
        """Whether a live worker serves the model; None for a model nobody announced and nobody expects."""
        if not self.exists(model):
            return None
        devices = list(await self.cards(model))
        if not devices:
            return False if model in self.expected else None
        return any((await self.live_workers(model, devices)).values())
