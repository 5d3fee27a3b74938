"""Jobs left pending by a dead worker: run them again if nothing was streamed; continue them from the ids they had
streamed (`Keys.generated`) where the worker can (`resumable`, OVQ_WORKER_TAKEOVER); else end them with an error.

Both of the worker's streams are covered: interactive jobs first, then batch lines. Parked jobs (common/fairness.py,
held by the consumer `PARK`) are waiting, not orphaned: never claimed here. Each pass claims the jobs and
says what to do with them (`Takeover`); the worker does it."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.errors import OvqError
from common.events import Error
from common.fairness import PARK
from common.jobs import Job, JobHash, JobStatus
from common.keys import GROUP, Keys
from common.redis.client import UNAVAILABLE, is_nogroup
from common.settings import Settings
from workers.queue.publisher import Outbox
from workers.vitals import Member

log = logging.getLogger("ovq.reclaim")


# KEYS: the stream, then the worker hash of each consumer; ARGV: the group, then the consumers.
# A consumer is removed only while its worker hash is absent and it holds no pending entry (DELCONSUMER would
# drop its pending entries with it, leaving them in the stream where nobody reclaims them). On a Redis Cluster the
# worker hashes live in other slots: KEYS is the stream alone and the caller checked them just before (a worker
# that comes back meanwhile with nothing pending only has its consumer re-made by its next read).
FORGET = """
local removed = 0
for i = 2, #ARGV do
  if (KEYS[i] == nil or redis.call('EXISTS', KEYS[i]) == 0)
      and #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[i]) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
"""


Entries = list[tuple[bytes, dict[bytes, bytes]]]


@dataclass
class Continued:
    """A job that had streamed, to continue: its record of generated ids and its prompt's token count."""

    entry_id: bytes
    fields: dict[bytes, bytes]
    generated: bytes
    prompt_tokens: int


@dataclass
class Takeover:
    """What a pass claimed from dead workers on one stream, for the worker to act on, in this order."""

    stream: str
    dead: list[dict[bytes, bytes]] = field(default_factory=list)  # delivered too often: to the dead letters
    outbox: Outbox = field(default_factory=Outbox)  # the errors of jobs that cannot run again, and their acks
    rerun: Entries = field(default_factory=list)  # to run again, as if just read from the stream
    continued: list[Continued] = field(default_factory=list)  # to go on from what they had streamed


class Reclaimer:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings, member: Member,
                 room: Callable[[], int], resumable: Callable[[Job], bool] = lambda job: False,
                 steady: Callable[[], bool] = lambda: True, extra: Callable[[], tuple[str, ...]] = tuple) -> None:
        self.redis, self.keys, self.settings, self.member, self.room = redis, keys, settings, member, room
        self.steady = steady  # whether stale heartbeats mean dead workers yet (workers/queue/heartbeat.py)
        self.extra = extra  # more streams to cover, after the member's own (prefix affinity's)
        self.resumable = resumable  # whether this worker can continue a job that had streamed
        self.reclaimed = 0
        self._forget = redis.register_script(FORGET)

    async def passes(self) -> AsyncIterator[Takeover]:
        """Every reclaim_interval_s, what a pass took over (when it took anything)."""
        while True:
            await asyncio.sleep(self.settings.reclaim_interval_s)
            if not self.steady():
                continue  # Redis was away lately: live workers' heartbeats are stale too
            try:
                taken = await self.reclaim_once()
            except UNAVAILABLE:
                continue  # Redis is away; the heartbeat loop says so
            except ResponseError as exc:
                if not is_nogroup(exc):  # the group is being recreated by the read loop
                    log.exception("reclaim pass failed")
                continue
            except Exception:
                log.exception("reclaim pass failed")
                continue
            for takeover in taken:
                yield takeover

    async def _live_workers(self) -> set[str]:
        m = self.member
        since = time.time() - self.settings.worker_ttl_s
        return {c.decode() for c in await self.redis.zrangebyscore(self.keys.workers(m.model, m.device), since, "+inf")}

    async def reclaim_once(self) -> list[Takeover]:
        """Claim what dead workers left pending on either stream (as much as there is room for), then forget
        the dead consumers that hold nothing any more."""
        live = await self._live_workers()
        sweep = self.sweeps(live, time.time())
        taken = []
        for stream in self.member.streams:
            if takeover := await self._take_over(stream, live):
                taken.append(takeover)
            if sweep:
                await self.forget_dead_consumers(stream, live)
        for stream in self.extra():
            try:
                if takeover := await self._take_over(stream, live):
                    taken.append(takeover)
                if sweep:
                    await self.forget_dead_consumers(stream, live)
            except ResponseError:
                continue  # expired, or without its group yet: nothing of it to take over
        return taken

    def sweeps(self, live: set[str], now: float) -> bool:
        """Whether this pass looks for dead consumers. The look reads a group's whole consumer list (XINFO CONSUMERS,
        one entry per worker that ever read the stream), so if every worker looked on every pass the fleet would
        read O(workers²) entries per interval (benchmarks/fleet_scale.py). The live workers take turns instead, one
        per reclaim interval by rank in the live set: about one look per interval, fleet-wide. A worker not (yet)
        in the live set looks on every pass, as all did before; a turn missed (clocks apart, a pass late) only
        delays a dead consumer's removal to a later turn, and removal is safe to repeat."""
        if self.member.id not in live:
            return True
        turn = int(now / self.settings.reclaim_interval_s) % len(live)
        return sorted(live)[turn] == self.member.id

    async def leave(self, streams: tuple[str, ...]) -> int:
        """The worker is leaving: its own consumer goes from each group where it holds nothing pending, so a fleet
        that autoscales does not leave a consumer per worker it ever ran. Where it handed jobs back (pending under
        it), the consumer stays until a reclaim pass has claimed them and forgets it (`forget_dead_consumers`)."""
        removed = 0
        for stream in streams:
            try:
                removed += int(await self._forget(keys=[stream], args=[GROUP, self.member.id]))
            except ResponseError:
                continue  # the stream or its group is gone: nothing to forget there
        return removed

    async def forget_dead_consumers(self, stream: str, live: set[str]) -> int:
        """Remove from the group the consumers of dead workers that hold no pending entry (their worker hash is
        gone, idle past the worker TTL); the check and the removal are one script, so no entry is lost."""
        idle_ms = self.settings.worker_ttl_s * 1000
        consumers = await self.redis.xinfo_consumers(stream, GROUP)
        dead = [c["name"].decode() if isinstance(c["name"], bytes) else c["name"] for c in consumers
                if c["pending"] == 0 and c["idle"] > idle_ms]
        dead = [name for name in dead if name not in live and name not in (self.member.id, PARK)]
        if not dead:
            return 0
        if self.keys.cluster:
            alive = await asyncio.gather(*(self.redis.exists(self.keys.worker(name)) for name in dead))
            dead = [name for name, there in zip(dead, alive, strict=True) if not there]
            removed = await self._forget(keys=[stream], args=[GROUP, *dead]) if dead else 0
        else:
            removed = await self._forget(keys=[stream, *(self.keys.worker(n) for n in dead)], args=[GROUP, *dead])
        if removed:
            log.info("removed %d dead consumers from %s", removed, stream)
        return int(removed)

    async def _take_over(self, stream: str, live: set[str]) -> Takeover | None:
        free = self.room()
        if free <= 0:
            return None
        idle_ms = int(self.settings.worker_ttl_s * 1000)
        # By consumer: the parked jobs (PARK's, maybe thousands) must not hide a dead worker's behind them.
        summary = await self.redis.xpending(stream, GROUP)
        names = [c["name"].decode() if isinstance(c["name"], bytes) else c["name"] for c in summary["consumers"] or ()]
        orphans = []
        for name in names:
            if name not in live and name != PARK and len(orphans) < free:
                orphans += await self.redis.xpending_range(stream, GROUP, "-", "+", count=free - len(orphans),
                                                           consumername=name, idle=idle_ms)
        if not orphans:
            return None
        claimed = await self.redis.xclaim(stream, GROUP, self.member.id, idle_ms, [p["message_id"] for p in orphans])
        self.reclaimed += len(claimed)
        deliveries = {p["message_id"]: p["times_delivered"] + 1 for p in orphans}
        takeover = Takeover(stream)
        outbox = takeover.outbox
        for entry_id, fields in claimed:
            if not fields:  # deleted meanwhile
                outbox.ack(entry_id, stream)
                continue
            job = Job.from_fields(fields)
            job.priority = self.member.level_of(stream)  # type: ignore[assignment]
            streamed, prompt_tokens, generated = await self._progress(job)
            if deliveries.get(entry_id, 0) > self.settings.max_deliveries:
                takeover.dead.append(fields)
                self._fail(outbox, stream, entry_id, job, "the job failed on every worker that tried it")
            elif streamed == b"1" and generated and prompt_tokens:
                takeover.continued.append(Continued(entry_id, fields, generated, int(prompt_tokens)))
            elif streamed == b"1":
                self._fail(outbox, stream, entry_id, job, "the worker running this job died mid-generation")
            else:
                takeover.rerun.append((entry_id, fields))
        if takeover.rerun or takeover.continued:
            log.warning("re-running %d jobs of dead workers, continuing %d", len(takeover.rerun),
                        len(takeover.continued))
        return takeover

    async def _progress(self, job: Job) -> tuple[bytes | None, bytes | None, bytes | None]:
        """Whether the job had streamed; if this worker could continue it, its prompt tokens and generated ids."""
        if not (self.settings.worker_takeover and self.resumable(job)):
            return await self.redis.hget(self.keys.job(job.id, job.model), JobHash.STREAMED), None, None
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.job(job.id, job.model), [JobHash.STREAMED, JobHash.PROMPT_TOKENS])
        pipe.get(self.keys.generated(job.id, job.model))
        (streamed, prompt_tokens), generated = await pipe.execute()
        return streamed, prompt_tokens, generated

    @staticmethod
    def _fail(outbox: Outbox, stream: str, entry_id: bytes, job: Job, message: str) -> None:
        error = OvqError(message, 500, "server_error")
        outbox.publish(job.reply_to, Error(job=job.id, seq=10_000, status=500, error=error.body))
        outbox.set_status(job.id, status=JobStatus.ERROR, error=error.body.model_dump())
        outbox.ack(entry_id, stream)
        outbox.forget(job.id)
