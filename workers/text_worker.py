"""The text worker's I/O half: feeds the engine process jobs, turns its token ids into text events."""
from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any

from common.config import ModelConfig
from common.errors import ErrorBody
from common.events import Accepted, Cancelled, Error, TokenLogprob
from common.jobs import Job
from common.servable import ServableType
from common.settings import Settings
from workers.base import BaseWorker
from workers.detokenizer import ByteTable, Detokenizer
from workers.engine import EngineSpec
from workers.engine_client import EngineClient, Target
from workers.jobstate import Choice, RunningJob
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
        self.detokenizer = Detokenizer(self.info.decode, ByteTable.build(self.info.tokenizer), self.info.end_ids())
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
        skip = job.params.skip_special_tokens
        streams = [self.detokenizer.stream(skip) for _ in range(job.params.n)]
        self.running[job.id] = RunningJob(job, entry_id, streams)
        if job.images:
            task = asyncio.create_task(self._add_with_images(job))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        self.engine.send(["add", job.id, job.prompt, job.add_special_tokens, job.params.model_dump(), [], job.kind])

    async def _add_with_images(self, job: Job) -> None:
        blobs = await self.redis.mget(job.images)
        if job.id not in self.running:  # cancelled meanwhile
            return
        if any(b is None for b in blobs):
            extra = {"status": 400, "message": "the request's images expired before the job started"}
            self._on_outputs([[job.id, [], "error", extra]])
            return
        images = [base64.b64encode(b).decode() for b in blobs]
        self.engine.send(["add", job.id, job.prompt, job.add_special_tokens, job.params.model_dump(), images,
                          job.kind])

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
        updates, work = [], []
        for update in outputs:
            state = self.running.get(update[0])
            if state is None:  # finished here already (a stop string the engine had not seen yet)
                continue
            _, ids, finish, extra, *rest = update
            index = rest[0] if rest else 0
            choice = state.choices[index] if index < len(state.choices) else None
            generated = finish in (None, "stop", "length") and choice is not None and choice.finish is None
            updates.append((state, choice, ids, finish, extra, rest[1] if len(rest) > 1 else None, generated))
            if generated:
                work.append((choice.detok, ids))
        texts = iter(self.detokenizer.step(work))
        for state, choice, ids, finish, extra, logprobs, generated in updates:
            text = next(texts) if generated else ""
            if state.job.id not in self.running:  # an error or cancel earlier in this batch ended it
                continue
            if finish == "accepted":
                self._accepted(state, extra, outbox)
            elif finish in ("cancelled", "error"):
                self._end(state, finish, outbox, extra)
            elif finish == "prompt" and choice is not None:
                self._echo(state, choice, ids, logprobs, outbox)
            elif generated:
                self._generated(state, choice, ids, text, finish, logprobs, outbox)
        self.publisher.put(outbox)

    def _generated(self, state: RunningJob, choice: Choice, ids: list[int], text: str, finish: str | None,
                   logprobs: list[float] | None, outbox: Outbox) -> None:
        job = state.job
        was_streamed = state.streamed
        delta = state.delta(choice, ids, text, self._entries(ids, logprobs))
        if delta:
            outbox.publish(job.reply_to, delta)
            if not was_streamed:
                outbox.set_status(job.id, streamed=1)
        if choice.stops.stopped and finish is None:
            self.engine.send(["cancel", job.id, choice.index])
            finish = "stop"
        if finish is not None:
            outbox.publish(job.reply_to, state.finish(choice, finish))
            if state.finished:
                self._end(state, "done", outbox)

    def _echo(self, state: RunningJob, choice: Choice, ids: list[int], logprobs: list[float] | None,
              outbox: Outbox) -> None:
        """The prompt first, as given (a string prompt) or decoded (token ids), with its log-probabilities."""
        prompt = state.job.prompt
        if isinstance(prompt, str):
            text = prompt
        else:
            text = self.info.decode([prompt], state.job.params.skip_special_tokens)[0]
        entries = self._entries(ids, logprobs)
        if entries:
            entries[0].logprob = None  # nothing predicts the first token
        outbox.publish(state.job.reply_to, state.echo(choice, text, entries))

    def _entries(self, ids: list[int], logprobs: list[float] | None) -> list[TokenLogprob] | None:
        if logprobs is None:
            return None
        texts = self.detokenizer.token_texts(ids)
        return [TokenLogprob(token=text, logprob=lp, bytes=list(raw))
                for (text, raw), lp in zip(texts, logprobs, strict=True)]

    def _end(self, state: RunningJob, end: str, outbox: Outbox, extra: Any = None) -> None:
        """The job's one terminal event: done (every choice finished), cancelled or error."""
        job = state.job
        self._job_done(state, outbox)
        if end == "cancelled":
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status="cancelled")
        elif end == "error":
            status = extra.pop("status")
            error = ErrorBody.model_validate(extra)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=status, error=error))
            outbox.set_status(job.id, status="error", error=error.model_dump())
        else:
            done = state.done()
            outbox.publish(job.reply_to, done)
            outbox.set_status(job.id, status="done", text="".join(state.choices[0].text),
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

