"""Jobs left pending by a dead worker: run them again if nothing was streamed, else end them with an error."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from common.errors import OvqError
from common.events import Error
from common.jobs import Job
from common.keys import GROUP
from common.redis_client import UNAVAILABLE
from workers.publisher import Outbox

if TYPE_CHECKING:
    from workers.base import BaseWorker

log = logging.getLogger("ovq.reclaim")


class Reclaimer:
    def __init__(self, worker: BaseWorker) -> None:
        self.worker = worker
        self.reclaimed = 0

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
        w = self.worker
        free = w.room()
        if free <= 0:
            return 0
        idle_ms = int(w.settings.worker_ttl_s * 1000)
        pending = await w.redis.xpending_range(w.stream, GROUP, "-", "+", count=100, idle=idle_ms)
        live = await self._live_workers()
        orphans = [p for p in pending if p["consumer"].decode() not in live][:free]
        if not orphans:
            return 0
        claimed = await w.redis.xclaim(w.stream, GROUP, w.id, idle_ms, [p["message_id"] for p in orphans])
        self.reclaimed += len(claimed)
        deliveries = {p["message_id"]: p["times_delivered"] + 1 for p in orphans}
        rerun = []
        outbox = Outbox()
        for entry_id, fields in claimed:
            if not fields:  # deleted meanwhile
                outbox.ack(entry_id)
                continue
            job = Job.from_fields(fields)
            streamed = await w.redis.hget(w.keys.job(job.id), "streamed")
            if deliveries.get(entry_id, 0) > w.settings.max_deliveries:
                await w.redis.xadd(w.keys.dead, {**fields, b"reason": b"delivered too often"})
                self._fail(outbox, entry_id, job, "the job failed on every worker that tried it")
            elif streamed == b"1":
                self._fail(outbox, entry_id, job, "the worker running this job died mid-generation")
            else:
                rerun.append((entry_id, fields))
        w.publisher.put(outbox)
        if rerun:
            log.warning("re-running %d jobs of dead workers", len(rerun))
            await w.admit(rerun)
        return len(claimed)

    @staticmethod
    def _fail(outbox: Outbox, entry_id: bytes, job: Job, message: str) -> None:
        error = OvqError(message, 500, "server_error")
        outbox.publish(job.reply_to, Error(job=job.id, seq=10_000, status=500, error=error.body))
        outbox.set_status(job.id, status="error", error=error.body.model_dump())
        outbox.ack(entry_id)
