"""The embeddings and rerank worker: batches the jobs that wait into one pipeline call.

It takes up to `max_num_seqs` jobs from the model's stream. Jobs wait here in arrival order; each turn tokenizes the
newcomers (to count their tokens and refuse inputs over the context), then runs the longest run of waiting jobs
whose padded size (texts x longest text) fits `OVQ_EMBED_BATCH_TOKENS` (the first always goes) as one
`embed_documents` call, or for rerank one `rerank` call per distinct query. A job cancelled while it waits ends at
once; one cancelled while its batch runs gets no result. Nothing is streamed, so a job of a worker that died is run
again by whichever worker reclaims it.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.errors import ErrorBody
from common.events import Cancelled, Done, Error, Timings, Usage
from common.jobs import EmbedParams, Job, JobStatus
from common.modelcard import ModelCard
from common.models.config import ModelConfig
from common.servable import ServableType, infer_servable, vocab_size
from common.settings import Settings
from workers.embed.pipelines import EncoderPipelines, TooLong, cut, encoder_limits
from workers.engine.continuous import error_message
from workers.ops.tracing import JobTimes
from workers.pipeline import PipelineWorker
from workers.queue.publisher import Outbox

log = logging.getLogger("ovq.embed_worker")


@dataclass(eq=False)  # a job is itself: `in` and `remove` on the waiting queue go by identity
class EncoderJob:
    job: Job
    entry_id: bytes
    seq: int = 0
    cancelled: bool = False
    streamed: bool = False  # never: the result is one event, so a dead worker's job can always run again
    received: float = field(default_factory=time.time)
    texts: list[str] | None = None  # the inputs as text, once prepared
    lengths: list[int] = field(default_factory=list)  # tokens of each text (of each query and document pair)
    prepared: float | None = None  # when its texts were counted (unix s)
    started: float | None = None  # when its batch's pipeline call began
    generated: float | None = None  # when it returned
    batch: int = 0  # the jobs in that call

    @property
    def params(self) -> EmbedParams:
        return self.job.embed or EmbedParams(inputs=[])

    def cost(self) -> tuple[int, int]:
        """(texts, longest): what it adds to a padded batch."""
        return len(self.lengths), max(self.lengths, default=0)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def summary(self) -> dict[str, float | int | None]:
        return {"queue_ms": round((self.received - self.job.created) * 1000, 1),
                "total_ms": round((time.time() - self.job.created) * 1000, 1),
                "prompt_tokens": sum(self.lengths)}


def take_batch(waiting: deque[EncoderJob], budget: int) -> list[EncoderJob]:
    """The longest run of prepared jobs from the front whose padded size fits the token budget; at least one job
    when the first is prepared (jobs that came while the others were being tokenized wait for the next turn)."""
    batch: list[EncoderJob] = []
    texts = longest = 0
    while waiting and waiting[0].texts is not None:
        count, length = waiting[0].cost()
        if batch and (texts + count) * max(longest, length) > budget:
            break
        texts, longest = texts + count, max(longest, length)
        batch.append(waiting.popleft())
    return batch


def encode_vectors(vectors: np.ndarray) -> list[str]:
    """OpenAI's base64 embedding: the float32 little-endian bytes of each vector."""
    little = vectors.astype("<f4", copy=False)
    return [base64.b64encode(row.tobytes()).decode() for row in little]


class EncoderWorker(PipelineWorker):
    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self.budget = settings.embed_batch_tokens
        self.waiting: deque[EncoderJob] = deque()
        self._wake = asyncio.Event()
        self._batcher: asyncio.Task[None] | None = None
        self.batches = 0
        self.configure(model)

    def configure(self, model: ModelConfig) -> None:
        device, path = self.device, Path(model.path)
        self.capacity = model.max_num_seqs
        self.kind = infer_servable(path, device, model.pipeline_type)
        self.limits = encoder_limits(model, self.kind, self.settings.embed_max_inputs)
        self.pipes = EncoderPipelines(model, self.kind, self.limits, device)
        self.card = ModelCard(
            name=model.name, device=device, servable_type=self.kind, context_length=self.limits.max_length,
            vocab_size=vocab_size(path), encoder=self.limits, created=int(path.stat().st_mtime),
            preference=model.devices.index(device) if device in model.devices else len(model.devices),
        )

    async def start_backend(self) -> None:
        dimensions = await asyncio.to_thread(self.pipes.load)
        self.limits.dimensions = dimensions
        self.card.encoder = self.limits
        self._batcher = asyncio.create_task(self._batch_loop(), name="batches")

    async def stop_backend(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()

    @property
    def backend_alive(self) -> bool:
        return self._batcher is None or not self._batcher.done()

    def describe(self) -> str:
        return f"{self.kind.value}, batches of up to {self.budget} tokens"

    def cancel_running(self, job_id: str) -> None:
        state = self.running[job_id]
        state.cancelled = True
        if state in self.waiting:  # not in a pipeline call yet: it ends now
            self.waiting.remove(state)
            self._end(state)

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        state = EncoderJob(job, entry_id)
        self._accept(state, outbox)
        self.waiting.append(state)
        self._wake.set()

    # ---- the batches ------------------------------------------------------------------------------------------
    async def _batch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.waiting:
                await self._prepare([s for s in self.waiting if s.texts is None])
                batch = take_batch(self.waiting, self.budget)
                if batch:
                    await self._run(batch)

    async def _prepare(self, states: list[EncoderJob]) -> None:
        """Texts and token counts of newcomers; a job with an input over the context ends with a 400."""
        if not states:
            return
        results = await asyncio.to_thread(self._prepared_all, states)
        for state, error in zip(states, results, strict=True):
            if error is not None and state in self.waiting:
                self.waiting.remove(state)
                self._end(state, error=error, status=400)

    def _prepared_all(self, states: list[EncoderJob]) -> list[str | None]:
        """Runs in a thread: every newcomer's texts counted in one tokenizer call (a call per job cost more than
        the embedding itself); should that call fail, job by job, so that one bad input fails its job only."""
        errors: list[str | None] = [None] * len(states)
        texts: list[list[str]] = [[] for _ in states]
        for index, state in enumerate(states):
            try:
                texts[index] = [text if isinstance(text, str) else self.pipes.decode(text)
                                for text in state.params.inputs]
            except Exception as exc:  # a token id the tokenizer cannot decode, say: this job's fault only
                errors[index] = f"the input could not be tokenized: {error_message(exc)}"
        ready = [i for i in range(len(states)) if errors[i] is None]
        try:
            counted = self._count([states[i] for i in ready], [texts[i] for i in ready])
        except Exception:
            counted = [self._count_one(states[i], texts[i]) for i in ready]
        for i, result in zip(ready, counted, strict=True):
            if isinstance(result, str):
                errors[i] = result
            else:
                states[i].lengths = result
        prepared = time.time()
        for index, state in enumerate(states):
            state.texts, state.prepared = [] if errors[index] else texts[index], prepared
        return errors

    def _count_one(self, state: EncoderJob, texts: list[str]) -> list[int] | str:
        try:
            return self._count([state], [texts])[0]
        except Exception as exc:
            return f"the input could not be tokenized: {error_message(exc)}"

    def _count(self, states: list[EncoderJob], texts: list[list[str]]) -> list[list[int] | str]:
        """Each job's token counts (a query and document pair counts both), or why it cannot run."""
        queries = [s.params.query for s in states if s.params.query is not None]
        flat = self.pipes.lengths([*queries, *(text for mine in texts for text in mine)])
        query_lengths, lengths = iter(flat[:len(queries)]), iter(flat[len(queries):])
        results: list[list[int] | str] = []
        for state, mine in zip(states, texts, strict=True):
            counts = [next(lengths) for _ in mine]
            if state.params.query is not None:
                query = next(query_lengths)
                results.append([min(query + n, self.limits.max_length) for n in counts])
                continue
            try:
                results.append(self.pipes.check(counts))
            except TooLong as exc:
                results.append(str(exc))
        return results

    async def _run(self, batch: list[EncoderJob]) -> None:
        live = [s for s in batch if not s.cancelled]
        started, wall = time.monotonic(), time.time()
        try:
            results = await asyncio.to_thread(self._compute, live)
        except Exception as exc:
            message = error_message(exc)
            log.error("a batch of %d jobs failed: %s", len(live), message)
            for state in live:
                self._end(state, error=message, status=500)
            return
        self.batches += 1
        generated = time.time()
        for state in live:
            state.started, state.generated, state.batch = wall, generated, len(live)
        log.debug("batch of %d jobs, %d texts in %.1f ms", len(live), sum(len(s.lengths) for s in live),
                  (time.monotonic() - started) * 1000)
        outbox = Outbox()  # the whole batch's answers in one round trip
        for state, result in zip(live, results, strict=True):
            self._end(state, result=result, outbox=outbox)
        self.publisher.put(outbox)

    def _compute(self, batch: list[EncoderJob]) -> list[list[str] | list[float]]:
        """Runs in a thread: one embed call for the whole batch, or one rerank call per distinct query."""
        if self.kind is ServableType.RERANK:
            return self._rerank(batch)
        texts = [text for state in batch for text in state.texts or []]
        vectors = self.pipes.embed(texts) if texts else np.zeros((0, 0), dtype=np.float32)
        results: list[list[str] | list[float]] = []
        start = 0
        for state in batch:
            count = len(state.texts or [])
            mine = cut(vectors[start:start + count], state.params.dimensions, self.limits.normalize)
            results.append(encode_vectors(mine))
            start += count
        return results

    def _rerank(self, batch: list[EncoderJob]) -> list[list[str] | list[float]]:
        by_query: dict[str, list[EncoderJob]] = {}
        for state in batch:
            by_query.setdefault(state.params.query or "", []).append(state)
        scores: dict[str, list[float]] = {}
        for query, states in by_query.items():
            documents = [text for state in states for text in state.texts or []]
            all_scores = self.pipes.rerank(query, documents) if documents else []
            start = 0
            for state in states:
                count = len(state.texts or [])
                scores[state.job.id] = all_scores[start:start + count]
                start += count
        return [scores[state.job.id] for state in batch]

    def _end(self, state: EncoderJob, result: list[str] | list[float] | None = None, error: str | None = None,
             status: int = 400, outbox: Outbox | None = None) -> None:
        """The job's one terminal event; into `outbox` when given (the caller sends it), else sent now."""
        job, own = state.job, outbox is None
        outbox = Outbox() if outbox is None else outbox  # an empty Outbox is falsy
        if job.id not in self.running:
            return
        self._job_done(state, outbox)
        summary = state.summary()
        if error is not None:
            kind = "server_error" if status >= 500 else "invalid_request_error"
            body = ErrorBody(message=error, type=kind, param="input" if status < 500 else None)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=status, error=body))
            outbox.set_status(job.id, status=JobStatus.ERROR, error=body.model_dump(), **summary)
        elif state.cancelled or result is None:
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status=JobStatus.CANCELLED, **summary)
        else:
            now = time.time()
            tokens = sum(state.lengths)
            timings = Timings(queue_ms=(state.received - job.created) * 1000, total_ms=(now - job.created) * 1000)
            usage = Usage(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
            if job.kind == "rerank":
                done = Done(job=job.id, seq=state.next_seq(), timings=timings, usage=usage, scores=list(result))
            else:
                done = Done(job=job.id, seq=state.next_seq(), timings=timings, usage=usage,
                            embeddings=[str(v) for v in result])
            outbox.publish(job.reply_to, done)
            # The result itself stays out of the job's hash: vectors are large and the caller has them.
            outbox.set_status(job.id, status=JobStatus.DONE, **summary)
            outbox.count("prompt_tokens", tokens)
        if job.traceparent is not None:
            self._trace(state, outbox, JobStatus.ERROR if error is not None
                        else JobStatus.CANCELLED if state.cancelled or result is None else JobStatus.DONE)
        if own:
            self.publisher.put(outbox)

    def _trace(self, state: EncoderJob, outbox: Outbox, end: JobStatus) -> None:
        """The job's spans (admission to counted tokens, its batch's pipeline call), sent once its outbox is."""
        work = "rerank.batch" if self.kind is ServableType.RERANK else "embed.batch"
        times = JobTimes(state.received, state.prepared, generated=state.generated, work=work,
                         started=state.started, batch=state.batch or None)
        published = times.spans(state.job, self.id, end, sum(state.lengths), 0, time.time())
        if published is not None:
            outbox.sent.append(published)
