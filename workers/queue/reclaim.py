"""Jobs left pending by a dead worker: run them again if nothing was streamed, else end them with an error.

Both of the worker's streams are covered: interactive jobs first, then batch lines."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from common.errors import OvqError
from common.events import Error
from common.jobs import Job, JobHash, JobStatus
from common.keys import GROUP
from common.redis.client import UNAVAILABLE
from workers.queue.publisher import Outbox

if TYPE_CHECKING:
    from workers.base import BaseWorker

log = logging.getLogger("ovq.reclaim")


# KEYS: the stream, then the worker hash of each consumer; ARGV: the group, then the consumers.
# A consumer is removed only while its worker hash is absent and it holds no pending entry (DELCONSUMER would
# drop its pending entries with it, leaving them in the stream where nobody reclaims them).
FORGET = """
local removed = 0
for i = 2, #ARGV do
  if redis.call('EXISTS', KEYS[i]) == 0
      and #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[i]) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed = removed + 1
  end
end
return removed
"""


class Reclaimer:
    def __init__(self, worker: BaseWorker) -> None:
        self.worker = worker
        self.reclaimed = 0
        self._forget = worker.redis.register_script(FORGET)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.worker.settings.reclaim_interval_s)
            try:
                await self.reclaim_once()
            except UNAVAILABLE:
                pass  # Redis is away; the heartbeat loop says so
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):  # the group is being recreated by the read loop
                    log.exception("reclaim pass failed")
            except Exception:
                log.exception("reclaim pass failed")

    async def _live_workers(self) -> set[str]:
        w = self.worker
        since = time.time() - w.settings.worker_ttl_s
        return {m.decode() for m in await w.redis.zrangebyscore(w.keys.workers(w.model.name, w.device), since, "+inf")}

    async def reclaim_once(self) -> int:
        """Take over what dead workers left pending on either stream (as much as there is room for), then
        forget the dead consumers that hold nothing any more."""
        live = await self._live_workers()
        taken = 0
        for stream in self.worker.streams:
            taken += await self._take_over(stream, live)
            await self.forget_dead_consumers(stream, live)
        return taken

    async def forget_dead_consumers(self, stream: str, live: set[str]) -> int:
        """Remove from the group the consumers of dead workers that hold no pending entry (their worker hash is
        gone, idle past the worker TTL); the check and the removal are one script, so no entry is lost."""
        w = self.worker
        idle_ms = w.settings.worker_ttl_s * 1000
        consumers = await w.redis.xinfo_consumers(stream, GROUP)
        dead = [c["name"].decode() if isinstance(c["name"], bytes) else c["name"] for c in consumers
                if c["pending"] == 0 and c["idle"] > idle_ms]
        dead = [name for name in dead if name not in live and name != w.id]
        if not dead:
            return 0
        removed = await self._forget(keys=[stream, *(w.keys.worker(name) for name in dead)], args=[GROUP, *dead])
        if removed:
            log.info("removed %d dead consumers from %s", removed, stream)
        return int(removed)

    async def _take_over(self, stream: str, live: set[str]) -> int:
        w = self.worker
        free = w.room()
        if free <= 0:
            return 0
        idle_ms = int(w.settings.worker_ttl_s * 1000)
        pending = await w.redis.xpending_range(stream, GROUP, "-", "+", count=100, idle=idle_ms)
        orphans = [p for p in pending if p["consumer"].decode() not in live][:free]
        if not orphans:
            return 0
        claimed = await w.redis.xclaim(stream, GROUP, w.id, idle_ms, [p["message_id"] for p in orphans])
        self.reclaimed += len(claimed)
        deliveries = {p["message_id"]: p["times_delivered"] + 1 for p in orphans}
        rerun = []
        outbox = Outbox()
        for entry_id, fields in claimed:
            if not fields:  # deleted meanwhile
                outbox.ack(entry_id, stream)
                continue
            job = Job.from_fields(fields)
            job.priority = "batch" if stream == w.batch_stream else "interactive"
            streamed = await w.redis.hget(w.keys.job(job.id), JobHash.STREAMED)
            if deliveries.get(entry_id, 0) > w.settings.max_deliveries:
                await w.dead_letter(fields, "delivered too often")
                self._fail(outbox, stream, entry_id, job, "the job failed on every worker that tried it")
            elif streamed == b"1":
                self._fail(outbox, stream, entry_id, job, "the worker running this job died mid-generation")
            else:
                rerun.append((entry_id, fields))
        w.publisher.put(outbox)
        if rerun:
            log.warning("re-running %d jobs of dead workers", len(rerun))
            await w.admit(rerun, stream)
        return len(claimed)

    @staticmethod
    def _fail(outbox: Outbox, stream: str, entry_id: bytes, job: Job, message: str) -> None:
        error = OvqError(message, 500, "server_error")
        outbox.publish(job.reply_to, Error(job=job.id, seq=10_000, status=500, error=error.body))
        outbox.set_status(job.id, status=JobStatus.ERROR, error=error.body.model_dump())
        outbox.ack(entry_id, stream)
