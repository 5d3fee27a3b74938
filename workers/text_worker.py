"""The text worker's I/O half: feeds the engine process jobs, turns its token ids into text events."""
from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any

from common.config import ModelConfig
from common.errors import ErrorBody
from common.events import Accepted, Cancelled, Error
from common.jobs import Job
from common.servable import ServableType
from common.settings import Settings
from workers.base import BaseWorker
from workers.detokenizer import ByteTable, Detokenizer
from workers.engine import EngineSpec
from workers.engine_client import EngineClient, Target
from workers.jobstate import RunningJob
from workers.publisher import Outbox
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
    plugin_config = dict(model.plugin_config)
    kind = info.card.servable_type
    if kind in (ServableType.LM, ServableType.VLM) and device == "CPU":
        # On CPU the default attention is paged (continuous batching inside); SDPA is the stateful pipeline.
        plugin_config.setdefault("ATTENTION_BACKEND", "SDPA")
    vision = kind in (ServableType.VLM, ServableType.VLM_CB)
    return EngineSpec(str(model.path), device, scheduler, plugin_config, info.card.context_length,
                      eviction, info.defaults, info.vocab_size, vision)


CB_ONLY = ("cache_size", "dynamic_split_fuse", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
           "cache_eviction_config")


def engine_target(kind: ServableType) -> Target:
    """Continuous batching steps many jobs in one pipeline; a stateful servable runs one job at a time."""
    if kind in (ServableType.LM, ServableType.VLM):
        from workers.stateful_engine import run as stateful

        return stateful
    from workers.engine import run as batching

    return batching


class TextWorker(BaseWorker):
    """Text out, from a continuous-batching engine (up to `max_num_seqs` jobs at once) or a stateful one (one)."""

    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self.info = ServableInfo.load(Path(model.path), model, device)
        self.card = self.info.card
        stateful = self.card.servable_type in (ServableType.LM, ServableType.VLM)
        self.capacity = 1 if stateful else model.max_num_seqs
        ignored = sorted(set(CB_ONLY) & model.model_fields_set) if stateful else []
        if ignored:
            log.warning("%s is a stateful servable: ignoring %s", model.name, ", ".join(ignored))
        self.detokenizer = Detokenizer(self.info.decode, ByteTable.build(self.info.tokenizer))
        self._pending: set[asyncio.Task[None]] = set()
        self.engine = EngineClient(engine_spec(model, device, self.info), engine_target(self.card.servable_type),
                                   self._on_outputs, self._on_engine_exit)

    async def start_backend(self) -> None:
        await self.engine.start()

    async def stop_backend(self) -> None:
        await self.engine.stop()

    @property
    def backend_alive(self) -> bool:
        return self.engine.alive

    def describe(self) -> str:
        kind = "byte-table" if self.detokenizer.table else "window"
        return f"{self.card.servable_type.value}, {kind} detokenizer"

    def cancel_running(self, job_id: str) -> None:
        self.engine.send(["cancel", job_id])


    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        """Hand the job to the engine; it answers `accepted` (prompt tokens) or an error right away."""
        self.running[job.id] = RunningJob(job, entry_id, self.detokenizer.stream())
        if job.images:
            task = asyncio.create_task(self._add_with_images(job))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        self.engine.send(["add", job.id, job.prompt, job.add_special_tokens, job.params.model_dump(), []])

    async def _add_with_images(self, job: Job) -> None:
        blobs = await self.redis.mget(job.images)
        if job.id not in self.running:  # cancelled meanwhile
            return
        if any(b is None for b in blobs):
            extra = {"status": 400, "message": "the request's images expired before the job started"}
            self._on_outputs([[job.id, [], "error", extra]])
            return
        images = [base64.b64encode(b).decode() for b in blobs]
        self.engine.send(["add", job.id, job.prompt, job.add_special_tokens, job.params.model_dump(), images])

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
        self._job_done(state, outbox)
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

    def _on_engine_exit(self) -> None:
        if self._stopping.is_set():
            return
        log.error("engine process died; failing %d running jobs and restarting it", len(self.running))
        self.engine.drop_pending()  # commands of the jobs failed just below
        self._fail_all(500, "the inference engine crashed while running this job")
        self._restart = asyncio.get_running_loop().create_task(self._restart_engine())

    async def _restart_engine(self) -> None:
        try:
            await self.engine.start()
        except Exception:
            log.exception("the engine could not be restarted; stopping the worker")
            self._stopping.set()

