"""A job's spans in the worker, joining the API's trace through the job's `traceparent` (common/tracing.py).

The I/O half notes a few clock readings per job anyway (taken from the stream, accepted by the engine, first and
latest tokens); when the job ends they become spans, with those times: no span is open while the job runs, and
nothing at all is done for a job that carries no trace context. The job's own span ends once the round trip that
publishes its terminal event has gone through (`JobTimes.spans` returns what to call then).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common import tracing
from common.jobs import Job


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


@dataclass
class JobTimes:
    """Unix times (s) of a job's milestones in this worker; None where it never got there."""

    received: float  # read from the stream
    accepted: float | None = None  # the engine took it (tokenized, checked, added)
    first_token: float | None = None
    last_token: float | None = None
    generated: float | None = None  # a pipeline job (image, speech, embeddings): its pipeline call returned
    steps: int | None = None  # an image job's denoising steps
    work: str = "image.generate"  # the pipeline call's span
    started: float | None = None  # when that call began (unset: when the job was accepted, else received)
    batch: int | None = None  # an embeddings or rerank job: the jobs its pipeline call ran together

    def spans(self, job: Job, worker: str, outcome: str, prompt_tokens: int, tokens: int,
              ended: float) -> Callable[[], None] | None:
        """Record the job's phases under a `worker.job` span; returns the call that records the publish and ends
        the job's span, for when its terminal event is out (None when the job is not traced)."""
        parent = tracing.parent(job.traceparent)
        if parent is None or not tracing.active():
            return None
        span = tracing.start("worker.job", parent, start_ns=_ns(self.received), **{
            "ovq.job": job.id, "ovq.worker": worker, "gen_ai.request.model": job.model, "ovq.device": job.device,
            "ovq.outcome": outcome, "gen_ai.usage.input_tokens": prompt_tokens, "gen_ai.usage.output_tokens": tokens})
        if self.accepted is not None:
            tracing.record("worker.admit", span, _ns(self.received), _ns(self.accepted))
        start = self.accepted or self.received
        if self.first_token is not None:
            tracing.record("engine.prefill", span, _ns(start), _ns(self.first_token), **{
                "gen_ai.usage.input_tokens": prompt_tokens})
            last = self.last_token or self.first_token
            itl = (last - self.first_token) * 1000 / (tokens - 1) if tokens > 1 else None
            tracing.record("engine.decode", span, _ns(self.first_token), _ns(last), **{
                "gen_ai.usage.output_tokens": tokens, "ovq.itl_ms.mean": itl})
        if self.generated is not None:
            tracing.record(self.work, span, _ns(self.started or start), _ns(self.generated),
                           **{"ovq.steps": self.steps, "ovq.batch_jobs": self.batch})
        handed = _ns(ended)

        def published() -> None:
            tracing.record("worker.publish", span, handed, tracing.now_ns())
            span.end(end_time=tracing.now_ns())

        return published
