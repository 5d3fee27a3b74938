"""A worker's I/O half, whatever its pipeline: reads jobs from its stream (only as many as it has room for),
skips the cancelled, hears cancels, heartbeats, reclaims jobs of dead workers, shuts down gracefully.

Subclasses say how a job runs: `start_backend`, `_start`, `cancel_running`, `stop_backend`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any, Protocol

import orjson
from redis.exceptions import ResponseError

from common.config import ModelConfig
from common.errors import ErrorBody, OvqError
from common.events import Cancelled, Error
from common.jobs import Job
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.redis_client import connect
from common.settings import Settings
from workers.heartbeat import Heartbeat
from workers.publisher import Outbox, Publisher
from workers.reclaim import Reclaimer

log = logging.getLogger("ovq.worker")


class JobState(Protocol):
    job: Job
    entry_id: bytes

    def next_seq(self) -> int: ...


class BaseWorker:
    card: ModelCard
    capacity: int

    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        self.settings, self.model, self.device = settings, model, device
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.keys = Keys(settings.key_prefix)
        self.stream = self.keys.jobs(model.name, device)
        self.running: dict[str, Any] = {}
        self._cancelled_early: dict[str, float] = {}
        self._cancels_heard_ms: int | None = None
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self.redis = connect(settings, max_connections=32)
        self.publisher = Publisher(self.redis, self.keys, self.stream, settings.job_ttl_s)
        self.heartbeat = Heartbeat(self)
        self.reclaimer = Reclaimer(self)

    # ---- what a kind of worker provides -----------------------------------------------------------------
    async def start_backend(self) -> None:
        raise NotImplementedError

    async def stop_backend(self) -> None:
        raise NotImplementedError

    @property
    def backend_alive(self) -> bool:
        return True

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        raise NotImplementedError

    def cancel_running(self, job_id: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return self.card.servable_type.value

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await self.start_backend()
        self.publisher.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        log.info("worker %s serving %s on %s (%s)", self.id, self.model.name, self.device, self.describe())
        tasks = [
            asyncio.create_task(self._read_loop(), name="read"),
            asyncio.create_task(self._cancel_loop(), name="cancel"),
            asyncio.create_task(self.heartbeat.run(), name="heartbeat"),
            asyncio.create_task(self.reclaimer.run(), name="reclaim"),
        ]
        stopper = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception():
                log.error("worker task %s failed", task.get_name(), exc_info=task.exception())
        await self._shutdown(tasks)

    async def _shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Stop reading, let running jobs finish for a grace period, end the rest with an error."""
        tasks[0].cancel()
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.running and time.monotonic() < deadline and self.backend_alive:
            await asyncio.sleep(0.05)
        self._fail_all(503, "the worker shut down before the job finished")
        await self.publisher.drain()
        for task in tasks:
            task.cancel()
        await self.heartbeat.leave()
        await self.stop_backend()
        await self.publisher.stop()
        await self.redis.aclose()

    # ---- reading jobs ----------------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        while True:
            free = self.capacity - len(self.running)
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            reply = await self.redis.xreadgroup(GROUP, self.id, {self.stream: ">"}, count=free, block=1000)
            for _stream, entries in reply or []:
                await self.admit(entries)

    async def admit(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """Start the jobs of one read: skip the cancelled, answer each with `accepted` or `error` at once."""
        outbox = Outbox()
        jobs = []
        for entry_id, fields in entries:
            try:
                jobs.append((entry_id, Job.from_fields(fields)))
            except Exception:
                log.exception("unreadable job %s moved to the dead-letter stream", entry_id)
                await self.redis.xadd(self.keys.dead, {**fields, b"reason": b"unreadable"})
                outbox.ack(entry_id)
                self._refuse_unreadable(fields.get(b"job", b""), outbox)
        cancelled = await self._flagged([(e, j) for e, j in jobs if not self._heard_since(e)])
        for entry_id, job in jobs:
            if job.id in cancelled or self._cancelled_early.pop(job.id, None):
                outbox.publish(job.reply_to, Cancelled(job=job.id, seq=1))
                outbox.set_status(job.id, status="cancelled")
                outbox.ack(entry_id)
                continue
            self._start(entry_id, job, outbox)
        self.publisher.put(outbox)

    @staticmethod
    def _refuse_unreadable(raw: bytes, outbox: Outbox) -> None:
        """A job this worker cannot read (another version?) still gets its one terminal event, if it says where."""
        try:
            data = orjson.loads(raw)
            job_id, reply_to = str(data["id"]), str(data["reply_to"])
        except Exception:
            return
        body = ErrorBody(message="the worker could not read this job (incompatible versions?)", type="server_error")
        outbox.publish(reply_to, Error(job=job_id, seq=1, status=500, error=body))

    def _heard_since(self, entry_id: bytes) -> bool:
        """Whether the job was queued after this worker began hearing cancels (stream ids are Redis time):
        then a cancel for it reaches `cancel()` and no flag lookup is needed."""
        return self._cancels_heard_ms is not None and int(entry_id.split(b"-")[0]) > self._cancels_heard_ms

    async def _flagged(self, jobs: list[tuple[bytes, Job]]) -> set[str]:
        if not jobs:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for _, job in jobs:
            pipe.exists(self.keys.cancel(job.id))
        return {job.id for (_, job), hit in zip(jobs, await pipe.execute(), strict=True) if hit}

    def _job_done(self, state: JobState, outbox: Outbox) -> None:
        del self.running[state.job.id]
        self._slot_free.set()
        outbox.ack(state.entry_id)

    def _fail_all(self, status: int, message: str) -> None:
        outbox = Outbox()
        for state in list(self.running.values()):
            error = OvqError(message, status, "server_error" if status >= 500 else "invalid_request_error")
            outbox.publish(state.job.reply_to, Error(job=state.job.id, seq=state.next_seq(), status=status,
                                                     error=error.body))
            outbox.set_status(state.job.id, status="error", error=error.body.model_dump())
            outbox.ack(state.entry_id)
        self.running.clear()
        self._slot_free.set()
        self.publisher.put(outbox)

    # ---- cancellation ----------------------------------------------------------------------------------
    async def _cancel_loop(self) -> None:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.keys.cancel_channel)
        async for message in pubsub.listen():
            if message["type"] == "subscribe":
                seconds, micros = await self.redis.time()
                self._cancels_heard_ms = seconds * 1000 + micros // 1000
            elif message["type"] == "message":
                self.cancel(message["data"].decode())

    def cancel(self, job_id: str) -> None:
        if job_id in self.running:
            self.cancel_running(job_id)
            return
        now = time.monotonic()
        # Remember briefly: the job may be between its cancel-flag check and its start.
        self._cancelled_early[job_id] = now
        if len(self._cancelled_early) > 10_000:
            self._cancelled_early = {j: t for j, t in self._cancelled_early.items() if now - t < 60}
