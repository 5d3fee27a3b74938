"""The text worker's I/O half: feeds the engine process jobs, turns its token ids into text events.

It also continues the jobs of a dead worker of its model (`workers/queue/reclaim.py` claims them): the ids that
worker recorded (`workers/text/progress.py`) are replayed through a new detokenizer and stop filter, so the text
goes on exactly where the client is, and go to the engine as the add's `resume` (prompt + those ids, the rest of
the budget); a structured job's grammar goes on as the grammar of what may follow its text
(`workers/engine/residual.py`). Not continued (they end with an error, as before): jobs with images, a structured
output whose grammar `residual` cannot take apart, beam search (it streams nothing before its end, so it is run
again anyway), and jobs of a stateful servable (its pipeline takes no `resume`)."""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import deque
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.errors import ErrorBody
from common.events import Accepted, Cancelled, Error
from common.jobs import Job, JobStatus
from common.models.config import ModelConfig
from common.redis.client import UNAVAILABLE
from common.servable import ServableType
from common.settings import Settings
from workers.base import BaseWorker
from workers.engine import protocol
from workers.engine.client import EngineClient, Target
from workers.engine.protocol import IDS, JOB, SHORT, STATE, EngineSpec, Updates
from workers.engine.residual import continuable
from workers.ops.tracing import JobTimes
from workers.queue.admission import Admission, Knee
from workers.queue.publisher import Outbox
from workers.queue.reclaim import Continued
from workers.text.adapters import RuntimeAdapters
from workers.text.detokenizer import ByteTable, Detokenizer
from workers.text.jobstate import Choice, RunningJob
from workers.text.progress import Progress
from workers.text.servable_info import ServableInfo

log = logging.getLogger("ovq.worker")
REBUILD_TRIES = 3  # engine rebuilds for a changed adapter set that may fail in a row before held jobs get an error


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
    spec = EngineSpec(str(model.path), device, scheduler, plugin_config, info.card.context_length,
                      eviction, info.defaults, info.vocab_size, vision, sorted(info.end_ids()), model.arrival_window_ms)
    spec.adapters = {name: {"path": str(adapter.path), "alpha": adapter.alpha}
                     for name, adapter in model.lora_adapters.items() if name in info.card.adapters}
    if info.card.speculative:
        spec.draft = {"path": str(model.draft_models_path), "device": model.draft_device or device,
                      "scheduler": model.draft_scheduler()}
    return spec


CB_ONLY = ("cache_size", "dynamic_split_fuse", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
           "cache_eviction_config", "arrival_window_ms", "draft_models_path", "lora_adapters", "target_itl_ms")


def engine_target(kind: ServableType) -> Target:
    """Continuous batching steps many jobs in one pipeline; a stateful servable runs one job at a time."""
    if kind in (ServableType.LM, ServableType.VLM):
        from workers.engine.stateful import run as stateful

        return stateful
    from workers.engine.continuous import run as batching

    return batching


class TextWorker(BaseWorker):
    """Text out, from a continuous-batching engine (as many jobs as it can schedule) or a stateful one (one)."""

    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self._pending: set[asyncio.Task[None]] = set()
        self.configure(model)
        self._restarting = False
        # After a failed step with several suspects: re-added one per step, so a failure names its culprit.
        self._probation: deque[RunningJob] = deque()
        self._probing: str | None = None
        # After a crash nothing names the culprit: a job that has made tokens on the engine since it was added there
        # went through a step, so it is no suspect. Tokens at its add; crashes it was in (two: dead-lettered).
        self._tokens_at_add: dict[str, int] = {}
        self._crashes: dict[str, int] = {}
        # LoRA adapters loaded at run time (docs/how-to/lora.md): the models file's and those applied to the engine
        # (`configure`), the jobs held for an adapter this engine has not got yet (job id -> its add's resume), and
        # the rebuild.
        adaptable = self.card.servable_type == ServableType.LM_CB
        self.runtime = RuntimeAdapters(self.redis, self.keys, model.name, self.id, settings.lora_rebuild_lock_s) \
            if adaptable else None
        self._held: dict[str, dict[str, Any] | None] = {}
        self._held_since: dict[str, float] = {}  # when each held job was held (time.monotonic())
        self._rebuild_failures = 0  # in a row: held jobs wait through REBUILD_TRIES of them
        self._rebuilding = False
        self._poke = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    def configure(self, model: ModelConfig) -> None:
        settings, device = self.settings, self.device
        self.info = ServableInfo.load(Path(model.path), model, device)
        self.card = self.info.card
        stateful = self.card.servable_type in (ServableType.LM, ServableType.VLM)
        self.capacity = 1 if stateful else model.max_num_seqs
        self.admission = None if stateful else Admission(model.max_num_seqs, model.max_num_batched_tokens,
                                                         model.cache_size > 0, knee=self._knee(settings, model))
        ignored = sorted(set(CB_ONLY) & model.model_fields_set) if stateful else []
        if ignored:
            log.warning("%s is a stateful servable: ignoring %s", model.name, ", ".join(ignored))
        self.detokenizer = Detokenizer(self.info.decode, ByteTable.build(self.info.tokenizer), self.info.end_ids())
        self.engine = EngineClient(engine_spec(model, device, self.info), engine_target(self.card.servable_type),
                                   self._on_message, self._on_engine_exit, lambda: bool(self.running),
                                   settings.engine_watchdog_s, settings.engine_start_timeout_s, self._on_engine_idle)
        self._static_adapters = dict(self.engine.spec.adapters)
        self._applied: dict[str, dict[str, Any]] = {}  # a new engine has none of the runtime adapters yet

    def can_carry(self, state: RunningJob) -> bool:
        """Nothing generated yet (it starts afresh), or it can go on from its tokens (not structured output, images,
        best_of), as after a crash."""
        return self._resume(state) is None or self.resumable(state.job)

    def carry_on(self, left: list[RunningJob]) -> None:
        """Jobs still running when the engine was replaced go on on the new one from what they had generated (one
        whose client left meanwhile ends as cancelled)."""
        for state in left:
            if self._cancelled_early.pop(state.job.id, None) is not None:
                outbox = Outbox()
                self._end(state, JobStatus.CANCELLED, outbox)
                self.publisher.put(outbox)
                continue
            if self.admission is not None:
                self.admission.sent(state.job.id, state.job.prompt)
            self._add(state, self._resume(state))

    @staticmethod
    def _knee(settings: Settings, model: ModelConfig) -> Knee | None:
        if settings.admission == "greedy":
            return None
        target = model.target_itl_ms / 1000 if model.target_itl_ms is not None else None
        return Knee(model.max_num_seqs, target)

    def admission_limits(self) -> tuple[int, int]:
        knee = self.admission.knee if self.admission is not None else None
        return (knee.knee(), knee.limit()) if knee is not None else (0, 0)

    async def start_backend(self) -> None:
        if self.runtime is not None:  # the adapters loaded before this worker started: in its first engine
            try:
                self._applied = await self.runtime.read()
            except UNAVAILABLE as exc:
                log.warning("could not read the runtime LoRA adapters (%s): they load at the next poll", exc)
            self.engine.spec = replace(self.engine.spec, adapters={**self._applied, **self._static_adapters})
        await self.engine.start()
        if self.runtime is not None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_adapters(), name="adapters")

    async def stop_backend(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await self.engine.stop()

    @property
    def backend_alive(self) -> bool:
        return self.engine.alive

    @property
    def can_sleep(self) -> bool:
        return True  # the engine process goes; the tokenizer, detokenizer and the rest of the I/O half stay

    def describe(self) -> str:
        kind = "byte-table" if self.detokenizer.table else "window"
        return f"{self.card.servable_type.value}, {kind} detokenizer"

    def engine_stats(self) -> list[float] | None:
        return self.admission.stats if self.admission is not None else None

    def room(self) -> int:
        if self._restarting or self._rebuilding or self._probation or self._probing:
            return 0
        if self.admission is None:
            return max(0, self.capacity - len(self.running))
        return self.admission.room(len(self.running))

    def resumable(self, job: Job) -> bool:
        params = job.params
        return (self.admission is not None and not job.images and (params.best_of or 1) <= 1
                and (params.structured is None or continuable(params.structured)))

    def cancel_running(self, job_id: str) -> None:
        if self._restarting:  # the engine is being replaced: the job is nowhere to cancel, end it here
            outbox = Outbox()
            self._end(self.running[job_id], JobStatus.CANCELLED, outbox)
            self.publisher.put(outbox)
            return
        self.engine.send(protocol.cancel_command(job_id))

    def drop(self, job_id: str) -> None:
        """Ended here at once, into an outbox that goes nowhere; the engine's later updates of it are ignored."""
        self._end(self.running[job_id], JobStatus.CANCELLED, Outbox())
        if not self._restarting:
            self.engine.send(protocol.cancel_command(job_id))

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        """Hand the job to the engine; it answers `accepted` (prompt tokens) or an error right away."""
        skip = job.params.skip_special_tokens
        streams = [self.detokenizer.stream(skip) for _ in range(job.params.n)]
        state = RunningJob(job, entry_id, streams, interval=self.settings.stream_interval_ms / 1000,
                           record=self.settings.worker_takeover and self.resumable(job))
        self.running[job.id] = state
        if self.admission is not None:
            self.admission.sent(job.id, job.prompt)
        continued = self._continuing.pop(job.id, None)
        if continued is not None:
            self._continue(state, continued, outbox)
            return
        self._add(state)

    def _continue(self, state: RunningJob, continued: Continued, outbox: Outbox) -> None:
        """A dead worker's job: replay what it had sent, tell the API this worker has it now (a second `accepted`),
        and go on from there (or end it, if every choice had ended)."""
        job = state.job
        try:
            progress = Progress.read(continued.generated, job.params.logprobs is not None)
        except ValueError as exc:
            log.error("job %s cannot be continued: its record of generated ids is unreadable (%s)", job.id, exc)
            extra = {"status": 500, "message": "the worker running this job died mid-generation",
                     "type": "server_error"}
            self._end(state, JobStatus.ERROR, outbox, extra)
            return
        for choice in state.choices:
            done = progress.choices.get(choice.index)
            if done is None:
                continue
            if done.finish is not None:
                choice.finish, choice.tokens, choice.ids = done.finish, done.tokens, done.ids
            elif done.ids:
                (text,) = self.detokenizer.replay([(choice.detok, done.ids)])
                entries = self._entries(done.ids, done.logprobs) if choice.logprobs is not None else None
                state.replay(choice, done.ids, text, entries)
        state.seq, state.streamed = progress.seq, True
        self._accepted(state, continued.prompt_tokens, outbox, count=False)
        if self.admission is not None:
            self.admission.answered(job.id, job.prompt, continued.prompt_tokens)
        log.warning("continuing job %s of a dead worker from %d generated tokens", job.id,
                    sum(len(c.ids) for c in state.choices))
        if state.finished:
            self._end(state, JobStatus.DONE, outbox)
            return
        self._add(state, state.resume())

    def _add(self, state: RunningJob, resume: dict[str, Any] | None = None) -> None:
        job = state.job
        adapter = job.params.adapter
        if self.runtime is not None and adapter is not None and adapter not in self.engine.spec.adapters:
            self._held[job.id] = resume  # loaded since this engine was built: wait for the rebuild with it
            self._held_since[job.id] = time.monotonic()
            self._poke.set()
            return
        self._tokens_at_add[job.id] = sum(c.tokens for c in state.choices)
        if job.images:
            task = asyncio.create_task(self._add_with_images(job, resume))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        self.engine.send(protocol.add_command(job.id, job.prompt, job.add_special_tokens, job.params.model_dump(), [],
                                              resume, job.kind))

    async def _add_with_images(self, job: Job, resume: dict[str, Any] | None) -> None:
        blobs = await self.redis.mget(job.images)
        if job.id not in self.running:  # cancelled meanwhile
            return
        if any(b is None for b in blobs):
            extra = {"status": 400, "message": "the request's images expired before the job started"}
            self._on_message([protocol.error(job.id, extra)], None)
            return
        images = [base64.b64encode(b).decode() for b in blobs]
        self.engine.send(protocol.add_command(job.id, job.prompt, job.add_special_tokens, job.params.model_dump(),
                                              images, resume, job.kind))

    def _accepted(self, state: RunningJob, prompt_tokens: int, outbox: Outbox, count: bool = True) -> None:
        """`count`: into the stats (not when a job is continued here: its worker counted it)."""
        job = state.job
        state.prompt_tokens, state.accepted = prompt_tokens, time.time()
        queue_ms = (state.received - job.created) * 1000
        accepted = Accepted(job=job.id, seq=state.next_seq(), worker=self.id, prompt_tokens=prompt_tokens,
                            queue_ms=queue_ms)
        outbox.publish(job.reply_to, accepted)
        outbox.set_status(job.id, status=JobStatus.RUNNING, worker=self.id, prompt_tokens=prompt_tokens,
                          streamed=int(state.streamed))
        if count:
            outbox.count("prompt_tokens", prompt_tokens)
            outbox.observe("queue", queue_ms)

    # ---- engine output ---------------------------------------------------------------------------------
    def _on_engine_idle(self, stats: list[Any]) -> None:
        """The engine idles and has freed what its jobs held: its stats replace the last busy step's (which the
        last job's final update came with), unless a job was sent to it since."""
        if self.admission is not None and not self.running:
            self.admission.stats = stats

    def _on_message(self, outputs: Updates, stats: list[Any] | None) -> None:
        """One engine message: its updates (most through the fast half), then held text due, then its stats."""
        outbox = Outbox()
        now, clock = time.time(), time.monotonic()
        itl: dict[tuple[float, int], int] = {}
        rest, tokens = self._more(outputs, now, clock, outbox, itl)
        if rest:
            tokens += self._batched(rest, now, clock, outbox, itl)
        if tokens:
            self.tokens_generated += tokens
            outbox.count("tokens", tokens)
        for (last, n), choices in itl.items():
            outbox.observe("itl", (now - last) * 1000 / n, n * choices)
        self._send_due(outbox, clock)
        self.publisher.put(outbox)
        if stats is not None:
            if self.admission is not None:
                self.admission.stepped(stats, tokens, clock)
            self._probing = None  # a step went through with it
            self._next_probation()
            self._slot_free.set()

    def _more(self, outputs: Updates, now: float, clock: float, outbox: Outbox,
              itl: dict[tuple[float, int], int]) -> tuple[list[tuple[RunningJob, list[Any]]], int]:
        """The fast half, for most updates: more tokens of a plain job already streaming (`protocol.running`, read
        in place). Its text is a table lookup, so it needs neither the decoder nor the batched half. The other
        updates come back with their jobs, for `_batched`; a job's later updates follow its first one there.
        Returns them and the tokens taken here."""
        running = self.running
        fast = self.detokenizer.table is not None
        rest: list[tuple[RunningJob, list[Any]]] = []
        later: set[str] = set()
        tokens = 0
        for update in outputs:
            job = update[JOB]
            state = running.get(job)
            if state is None:  # finished here already (a stop string the engine had not seen yet)
                continue
            if (fast and len(update) == SHORT and update[STATE] is None and state.plain and state.streamed
                    and state.first_token and job not in later):
                ids = update[IDS]
                choice = state.choices[0]
                tokens += len(ids)
                self._count(state, choice, ids, now, outbox, itl)
                delta = state.more(choice, ids, choice.detok.text(ids), clock)  # type: ignore[attr-defined]
                if delta is not None:
                    outbox.publish(state.job.reply_to, delta)
                    if state.unrecorded:
                        outbox.record(job, *state.take_record())  # type: ignore[misc]
                continue
            rest.append((state, update))
            later.add(job)
        return rest, tokens

    def _batched(self, rest: list[tuple[RunningJob, list[Any]]], now: float, clock: float, outbox: Outbox,
                 itl: dict[tuple[float, int], int]) -> int:
        """The batched half: every other update, read by name; the generated ids of all of them decoded in one pass.
        Returns the tokens taken."""
        updates, work = [], []
        for state, update in rest:
            _, ids, finish, extra, index, logprobs = protocol.full(update)
            choice = state.choices[index] if index < len(state.choices) else None
            generated = finish in protocol.GENERATED and choice is not None and choice.finish is None
            updates.append((state, choice, ids, finish, extra, logprobs, generated))
            if generated:
                work.append((choice.detok, ids))
        texts = iter(self.detokenizer.step(work))
        running, tokens = self.running, 0
        for state, choice, ids, finish, extra, logprobs, generated in updates:
            text = next(texts) if generated else ""
            if state.job.id not in running:  # an error or cancel earlier in this batch ended it
                continue
            if generated:  # the usual update first: the others are one per job
                tokens += len(ids)
                self._count(state, choice, ids, now, outbox, itl)
                self._generated(state, choice, ids, text, finish, logprobs, outbox, clock,
                                extra == protocol.ENDED_ON_EOS)
            elif finish == protocol.ACCEPTED:
                self._accepted(state, extra, outbox)
                if self.admission is not None:
                    self.admission.answered(state.job.id, state.job.prompt, extra)
            elif finish in (protocol.CANCELLED, protocol.ERROR):
                self._end(state, finish, outbox, extra)
            elif finish == protocol.PROMPT and choice is not None:
                self._echo(state, choice, ids, logprobs, outbox)
        return tokens

    def _send_due(self, outbox: Outbox, now: float) -> None:
        """Held text past its stream interval, also of jobs this step gave no token (preempted, prefilling)."""
        for state in self.running.values():
            # Checked here, not by a call per job and step: most jobs hold nothing due (those that stepped were
            # checked against the same clock when their tokens came).
            for choice in state.choices:
                if (choice.held or choice.held_entries) and now - (choice.sent_at or 0.0) >= state.interval:
                    for event in state.due(now):
                        outbox.publish(state.job.reply_to, event)
                    self._record(state, outbox)
                    break

    @staticmethod
    def _count(state: RunningJob, choice: Choice, ids: list[int], now: float, outbox: Outbox,
               itl: dict[tuple[float, int], int]) -> None:
        """TTFT into this step's stats; inter-token latency into `itl`, by (previous tokens' time, tokens): the
        choices that stepped together share one, so a step adds one or two observations, not one per choice."""
        if not ids:
            return
        if state.first_token is None:
            outbox.observe("ttft", (now - state.job.created) * 1000)
        last, choice.last_token = choice.last_token, now
        if last is not None:
            key = (last, len(ids))
            itl[key] = itl.get(key, 0) + 1

    def _generated(self, state: RunningJob, choice: Choice, ids: list[int], text: str, finish: str | None,
                   logprobs: list[float] | None, outbox: Outbox, clock: float, ended: bool = False) -> None:
        """`ended`: the choice ended on an end-of-sequence id (no text, but a token of its usage)."""
        job = state.job
        was_streamed = state.streamed
        entries = self._entries(ids, logprobs) if logprobs is not None else None
        delta = state.delta(choice, ids, text, entries, clock)
        if delta:
            outbox.publish(job.reply_to, delta)
            if not was_streamed:
                outbox.set_status(job.id, streamed=1)
        if choice.stops.stopped and finish is None:
            self.engine.send(protocol.cancel_command(job.id, choice.index))
            finish = protocol.STOP
        if finish is not None:
            outbox.publish(job.reply_to, state.finish(choice, finish, ended))
            if state.finished:
                self._end(state, JobStatus.DONE, outbox)
                return
        self._record(state, outbox)

    @staticmethod
    def _record(state: RunningJob, outbox: Outbox) -> None:
        """The ids of the text this outbox sends, into it too (`RunningJob.record`)."""
        taken = state.take_record()
        if taken is not None:
            outbox.record(state.job.id, *taken)

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
            entries[0]["logprob"] = None  # nothing predicts the first token
        outbox.publish(state.job.reply_to, state.echo(choice, text, entries))
        outbox.set_status(state.job.id, streamed=1)
        self._record(state, outbox)

    def _entries(self, ids: list[int], logprobs: list[float] | None) -> list[dict[str, Any]] | None:
        if logprobs is None:
            return None
        texts = self.detokenizer.token_texts(ids)
        return [{"token": text, "logprob": lp, "bytes": list(raw)}
                for (text, raw), lp in zip(texts, logprobs, strict=True)]

    def _end(self, state: RunningJob, end: str, outbox: Outbox, extra: Any = None) -> None:
        """The job's one terminal event: done (every choice finished), cancelled or error."""
        job = state.job
        self._job_done(state, outbox)
        summary = state.summary()
        if end == JobStatus.CANCELLED:
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status=JobStatus.CANCELLED, **summary)
        elif end == JobStatus.ERROR:
            for event in state.due(0.0, everything=True):  # what it had generated comes before the error
                outbox.publish(job.reply_to, event)
            status = extra.pop("status")
            error = ErrorBody.model_validate(extra)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=status, error=error))
            outbox.set_status(job.id, status=JobStatus.ERROR, error=error.model_dump(), **summary)
        else:
            done = state.done()
            outbox.publish(job.reply_to, done)
            outbox.set_status(job.id, status=JobStatus.DONE, result=done.model_dump(mode="json"), **summary)
            if self.settings.keep_job_text:  # off by default: the client has had the text; Redis need not keep it
                outbox.set_status(job.id, text="".join(state.choices[0].text))
        if job.traceparent is not None:
            self._trace(state, end, summary, outbox)

    def _trace(self, state: RunningJob, end: str, summary: dict[str, Any], outbox: Outbox) -> None:
        last = max((c.last_token for c in state.choices if c.last_token is not None), default=None)
        times = JobTimes(state.received, state.accepted, state.first_token, last)
        published = times.spans(state.job, self.id, end, state.prompt_tokens, int(summary["completion_tokens"] or 0),
                                time.time())
        if published is not None:
            outbox.sent.append(published)

    def _job_done(self, state: RunningJob, outbox: Outbox) -> None:
        super()._job_done(state, outbox)
        self._tokens_at_add.pop(state.job.id, None)
        self._crashes.pop(state.job.id, None)
        if state.recorded_once or state.unrecorded or state.streamed:
            outbox.forget(state.job.id)
        if self.admission is not None:
            self.admission.forget(state.job.id)
            if not self.running:
                self.admission.idle()
        if self._probing == state.job.id:
            self._probing = None
            self._next_probation()

    # ---- LoRA adapters loaded at run time ------------------------------------------------------------------
    async def _watch_adapters(self) -> None:
        """Every lora_poll_s (at once when a job waits for an adapter): read the model's adapters; when they differ
        from the engine's, take the model's rebuild turn and rebuild; then let the held jobs in (or end them with
        a 404 when their adapter is gone, a 503 when the engine failed REBUILD_TRIES times in a row to take it)."""
        assert self.runtime is not None
        while True:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.settings.lora_poll_s)
            self._poke.clear()
            try:
                read_at = time.monotonic()
                wanted = await self.runtime.read()
                if wanted != self._applied:
                    if not await self.runtime.lock():
                        log.debug("another worker of %s is rebuilding; %d jobs held", self.model.name,
                                  len(self._held))
                        continue  # this one's turn comes at a later poll
                    try:
                        applied = await self._rebuild(wanted)
                    finally:
                        await self.runtime.unlock()
                    self._rebuild_failures = 0 if applied else self._rebuild_failures + 1
                    if not applied and self._rebuild_failures < REBUILD_TRIES:
                        continue  # its held jobs wait for the next try (an engine slow to start under load)
                    self._rebuild_failures %= REBUILD_TRIES  # the held jobs end below; new ones wait again
            except UNAVAILABLE as exc:
                log.warning("runtime LoRA adapters not read (%s); trying again", exc)
                await asyncio.sleep(self.settings.lora_poll_s)  # Redis is away: no tighter loop than the poll
                continue
            except Exception:  # a rebuild that failed must not end the watcher: held jobs wait on it
                log.exception("the LoRA adapter rebuild failed; trying again")
                continue
            self._release_held(wanted, read_at)

    async def _rebuild(self, wanted: dict[str, dict[str, Any]]) -> bool:
        """Take no new job, let the running ones finish (up to lora_drain_s), then replace the engine with one that
        has `wanted`; jobs still running go on from their tokens on it, as after a takeover. False: the engine
        could not be built with them and runs with its old adapters again."""
        log.info("LoRA adapters changed (%s); rebuilding the engine", ", ".join(sorted(wanted)) or "none")
        self._rebuilding = True
        try:
            deadline = time.monotonic() + self.settings.lora_drain_s
            while any(j not in self._held for j in self.running) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            late = [j for j in self.running if j not in self._held]
            if late:
                log.warning("rebuilding with %d jobs still running after %.0fs (they go on from their tokens): %s",
                            len(late), self.settings.lora_drain_s,
                            ", ".join(f"{j} ({self.running[j].job.params.adapter})" for j in late[:8]))
            self._restarting = True
            self.engine.drop_pending()
            previous = self.engine.spec
            running = [s for s in self.running.values() if s.job.id not in self._held]
            applied = True
            try:
                await self.engine.replace(replace(previous, adapters={**wanted, **self._static_adapters}))
                self._applied = wanted
            except Exception as exc:  # an adapter GenAI refuses, or a start too slow: serve with the old ones
                log.error("the engine could not be rebuilt with the new LoRA adapters (%s); keeping the old ones",
                          exc)
                applied = False
                await self.engine.replace(previous)
            self.engine_restarts += 1
            for state in running:
                if state.job.id not in self.running:
                    continue
                if self._resume(state) is not None and not self.resumable(state.job):
                    self._crashed(state, "the engine was rebuilt for a LoRA adapter change while running this job",
                                  False)
                else:
                    self._add(state, self._resume(state))
        finally:
            self._restarting = self._rebuilding = False
            self._slot_free.set()
        return applied

    def _release_held(self, wanted: dict[str, dict[str, Any]], read_at: float) -> None:
        """Into the engine, the held jobs whose adapter it has; the others end: a 404 for an adapter unloaded
        meanwhile, a 503 for one still loaded that the engine could not be built with (REBUILD_TRIES times). A job
        held since `wanted` was read (at `read_at`) whose adapter it lacks waits for the next read: its adapter
        may have been loaded after that read (CI: a request for an adapter loaded a moment before ended a 404)."""
        for job_id, resume in list(self._held.items()):
            state = self.running.get(job_id)
            adapter = state.job.params.adapter if state is not None else None
            if state is not None and adapter not in self.engine.spec.adapters and adapter not in wanted \
                    and self._held_since.get(job_id, 0.0) > read_at:
                self._poke.set()
                continue
            del self._held[job_id]
            self._held_since.pop(job_id, None)
            if state is None:
                continue
            if adapter in self.engine.spec.adapters:
                self._add(state, resume)
                continue
            outbox = Outbox()
            self._end(state, JobStatus.ERROR, outbox, {
                "status": 404, "message": f"The LoRA adapter `{adapter}` was unloaded",
                "type": "invalid_request_error", "param": "model", "code": "model_not_found"} if adapter not in wanted
                else {"status": 503, "message": f"The engine could not be built with the LoRA adapter `{adapter}` "
                      f"({REBUILD_TRIES} tries); see the worker's log", "type": "service_unavailable",
                      "code": "service_unavailable"})
            self.publisher.put(outbox)

    # ---- engine failures -------------------------------------------------------------------------------
    def _on_engine_exit(self, kind: str, report: dict[str, Any] | None) -> None:
        """A failed step fails only its culprit: the others go on, from what they had generated, on a new
        engine. After a crash or a hang, which names no culprit, so do the jobs that went through a step on it
        (`_after_crash`)."""
        if self._stopping.is_set():
            return
        self._restarting = True
        self.engine.drop_pending()  # commands of jobs failed or re-sent just below
        running = list(self.running.values())
        if kind == "broken" and report is not None:
            suspects = [s for s in running if s.job.id in report[protocol.SUSPECTS]]
            innocents = [s for s in running if s.job.id not in report[protocol.SUSPECTS]]
            if len(suspects) == 1:
                self._fail(suspects.pop(), report[protocol.BROKEN])
            log.error("engine step failed (%s); restarting it: %d jobs go on, %d suspects re-run one at a time",
                      report[protocol.BROKEN], len(innocents), len(suspects))
        else:
            innocents, suspects = self._after_crash(running, "stopped responding" if kind == "unresponsive"
                                                    else "crashed")
        self.engine_restarts += 1
        task = asyncio.get_running_loop().create_task(self._restart_engine(innocents, suspects))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _after_crash(self, running: list[RunningJob], what: str) -> tuple[list[RunningJob], list[RunningJob]]:
        """The engine process died or hung, saying nothing: the jobs that made tokens on it since they were added
        go on from them on a new engine, as a takeover does; the others, added since, are the suspects, re-run one
        at a time. A job in a second crash is failed and goes to the dead letters: it is the likely cause. A job
        that cannot go on from its tokens (a grammar `residual` cannot take apart, images, best_of) fails as before."""
        innocents, suspects, failed = [], [], 0
        for state in running:
            crashes = self._crashes[state.job.id] = self._crashes.get(state.job.id, 0) + 1
            if crashes >= 2 or (self._resume(state) is not None and not self.resumable(state.job)):
                failed += 1
                self._crashed(state, f"the inference engine {what} while running this job", crashes >= 2)
            elif sum(c.tokens for c in state.choices) > self._tokens_at_add.get(state.job.id, 0):
                innocents.append(state)
            else:
                suspects.append(state)
        log.error("engine process %s; restarting it: %d jobs go on, %d suspects re-run one at a time, %d failed",
                  what, len(innocents), len(suspects), failed)
        return innocents, suspects

    def _crashed(self, state: RunningJob, why: str, dead_letter: bool) -> None:
        """Fail the job (one error event); a job in its second crash also goes to the dead letters (`ovq dead`)."""
        outbox = Outbox()
        fields = {k.encode(): v for k, v in state.job.to_fields().items()}
        self._end(state, JobStatus.ERROR, outbox, {"status": 500, "message": why, "type": "server_error",
                                                   "code": "engine_crashed"})
        self.publisher.put(outbox)
        if dead_letter:
            task = asyncio.get_running_loop().create_task(self.dead_letter(fields, f"{why}, twice"))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _fail(self, state: RunningJob, message: str) -> None:
        structured = state.job.params.structured is not None
        extra = ({"status": 400, "message": f"invalid structured output: {message}", "param": "response_format"}
                 if structured else
                 {"status": 500, "message": "the inference engine could not run this request", "type": "server_error"})
        outbox = Outbox()
        self._end(state, JobStatus.ERROR, outbox, extra)
        self.publisher.put(outbox)

    async def _restart_engine(self, innocents: list[RunningJob], suspects: list[RunningJob]) -> None:
        try:
            await self.engine.start()
        except Exception as exc:
            log.error("the engine could not be restarted (%s); stopping the worker", exc)
            self._fail_all(500, "the inference engine failed and could not be restarted")
            self._stopping.set()
            return
        for state in innocents:
            if state.job.id in self.running:
                self._add(state, self._resume(state))
        self._probation.extend(suspects)
        self._restarting = False
        self._next_probation()
        self._slot_free.set()

    @staticmethod
    def _resume(state: RunningJob) -> dict[str, Any] | None:
        """Nothing sent yet: run it afresh. Else go on from each choice's generated ids."""
        return state.resume() if any(c.ids or c.text for c in state.choices) else None

    def _next_probation(self) -> None:
        while self._probing is None and self._probation:
            state = self._probation.popleft()
            if state.job.id in self.running:
                self._probing = state.job.id
                self._add(state, self._resume(state))
