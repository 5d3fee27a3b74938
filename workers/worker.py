"""The worker's I/O half: reads jobs from its stream, feeds the engine process, publishes what it makes."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.config import ModelConfig
from common.errors import ErrorBody, OvqError
from common.events import Accepted, Cancelled, Error
from common.jobs import Job
from common.keys import GROUP, Keys
from common.settings import Settings
from workers.detokenizer import ByteTable, Detokenizer
from workers.engine import EngineSpec
from workers.engine_client import EngineClient
from workers.heartbeat import Heartbeat
from workers.jobstate import RunningJob
from workers.publisher import Outbox, Publisher
from workers.reclaim import Reclaimer
from workers.servable_info import ServableInfo

log = logging.getLogger("ovq.worker")


def engine_spec(model: ModelConfig, device: str, info: ServableInfo) -> EngineSpec:
    scheduler = {
        "max_num_batched_tokens": model.max_num_batched_tokens,
        "cache_size": model.cache_size,
        "max_num_seqs": model.max_num_seqs,
        "dynamic_split_fuse": model.dynamic_split_fuse,
        "enable_prefix_caching": model.enable_prefix_caching,
    }
    eviction = model.cache_eviction_config.model_dump() if model.cache_eviction_config else None
    return EngineSpec(str(model.path), device, scheduler, dict(model.plugin_config), info.card.context_length,
                      eviction, info.defaults, info.vocab_size)


class Worker:
    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        self.settings, self.model, self.device = settings, model, device
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.keys = Keys(settings.key_prefix)
        self.stream = self.keys.jobs(model.name, device)
        self.capacity = model.max_num_seqs
        self.running: dict[str, RunningJob] = {}
        self._cancelled_early: dict[str, float] = {}
        self._cancels_heard_ms: int | None = None
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self.info = ServableInfo.load(Path(model.path), model, device)
        self.redis = aioredis.Redis.from_url(settings.redis_url or "redis://127.0.0.1:6379/0")
        self.publisher = Publisher(self.redis, self.keys, self.stream, settings.job_ttl_s)
        self.detokenizer = Detokenizer(self.info.decode, ByteTable.build(self.info.tokenizer))
        self.engine = EngineClient(engine_spec(model, device, self.info), self._on_outputs, self._on_engine_exit)
        self.heartbeat = Heartbeat(self)
        self.reclaimer = Reclaimer(self)

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await self.engine.start()
        self.publisher.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        log.info("worker %s serving %s on %s (%s, %s detokenizer)", self.id, self.model.name, self.device,
                 self.info.card.servable_type.value, "byte-table" if self.detokenizer.table else "window")
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
        while self.running and time.monotonic() < deadline and self.engine.alive:
            await asyncio.sleep(0.05)
        self._fail_all(503, "the worker shut down before the job finished")
        await self.publisher.drain()
        for task in tasks:
            task.cancel()
        await self.heartbeat.leave()
        await self.engine.stop()
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
        cancelled = await self._flagged([(e, j) for e, j in jobs if not self._heard_since(e)])
        for entry_id, job in jobs:
            if job.id in cancelled or self._cancelled_early.pop(job.id, None):
                outbox.publish(job.reply_to, Cancelled(job=job.id, seq=1))
                outbox.set_status(job.id, status="cancelled")
                outbox.ack(entry_id)
                continue
            self._start(entry_id, job, outbox)
        self.publisher.put(outbox)

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

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        """Hand the job to the engine; it answers `accepted` (prompt tokens) or an error right away."""
        self.running[job.id] = RunningJob(job, entry_id, self.detokenizer.stream())
        self.engine.send(["add", job.id, job.prompt, job.add_special_tokens, job.params.model_dump()])

    def _accepted(self, state: RunningJob, prompt_tokens: int, outbox: Outbox) -> None:
        job = state.job
        state.prompt_tokens = prompt_tokens
        queue_ms = (state.received - job.created) * 1000
        accepted = Accepted(job=job.id, seq=state.next_seq(), worker=self.id, prompt_tokens=prompt_tokens,
                            queue_ms=queue_ms)
        outbox.publish(job.reply_to, accepted)
        outbox.set_status(job.id, status="running", worker=self.id, prompt_tokens=prompt_tokens, streamed=0)

    # ---- engine output ---------------------------------------------------------------------------------
    def _on_outputs(self, outputs: list[list[Any]]) -> None:
        outbox = Outbox()
        # Jobs absent from `running` finished here already (a stop string the engine had not seen yet).
        live = [(self.running[u[0]], u[1], u[2], u[3]) for u in outputs if u[0] in self.running]
        texts = self.detokenizer.step([(state.detok, ids) for state, ids, _, _ in live])
        for (state, ids, finish, extra), text in zip(live, texts, strict=True):
            job_id = state.job.id
            if finish == "accepted":
                self._accepted(state, extra, outbox)
                continue
            was_streamed = state.streamed
            delta = state.delta(ids, text)
            if delta:
                outbox.publish(state.job.reply_to, delta)
                if not was_streamed:
                    outbox.set_status(job_id, streamed=1)
            if state.stops.stopped and finish is None:
                self.engine.send(["cancel", job_id])
                finish = "stop"
            if finish is not None:
                self._finish(state, finish, outbox, extra)
        self.publisher.put(outbox)

    def _finish(self, state: RunningJob, finish: str, outbox: Outbox, extra: Any = None) -> None:
        job = state.job
        del self.running[job.id]
        self._slot_free.set()
        if finish == "cancelled":
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status="cancelled")
        elif finish == "error":
            status = extra.pop("status")
            error = ErrorBody.model_validate(extra)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=status, error=error))
            outbox.set_status(job.id, status="error", error=error.model_dump())
        else:
            tail = state.flush()
            if tail:
                outbox.publish(job.reply_to, tail)
            done = state.done(finish)
            outbox.publish(job.reply_to, done)
            outbox.set_status(job.id, status="done", text="".join(state.text),
                              result=done.model_dump(mode="json"))
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

    def _on_engine_exit(self) -> None:
        if self._stopping.is_set():
            return
        log.error("engine process died; failing %d running jobs and restarting it", len(self.running))
        self._fail_all(500, "the inference engine crashed while running this job")
        asyncio.get_running_loop().create_task(self.engine.start())

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
            self.engine.send(["cancel", job_id])
            return
        now = time.monotonic()
        # Remember briefly: the job may be between its cancel-flag check and its start.
        self._cancelled_early[job_id] = now
        if len(self._cancelled_early) > 10_000:
            self._cancelled_early = {j: t for j, t in self._cancelled_early.items() if now - t < 60}
