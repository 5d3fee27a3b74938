"""What the workers that call a GenAI pipeline from a thread of their I/O process (image, speech, embeddings and
rerank) do alike: a job starts the moment it is admitted, so it is `accepted` at once (no prompt tokens are known
then), and its work runs as a task the worker holds on to (the event loop keeps only weak references to tasks)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from common.events import Accepted
from common.jobs import Job, JobStatus
from common.modelcard import ModelCard
from common.models.config import ModelConfig
from common.settings import Settings
from workers.base import BaseWorker, JobState
from workers.queue.publisher import Outbox


def pipeline_card(model: ModelConfig, device: str, **kind: Any) -> ModelCard:
    """A pipeline servable's card: `kind` names its type and limits; the rest is every servable's (the directory's
    date, the device's place in the model's `devices`)."""
    return ModelCard(name=model.name, device=device, created=int(Path(model.path).stat().st_mtime),
                     preference=model.devices.index(device) if device in model.devices else len(model.devices),
                     **kind)


@dataclass
class PipelineRun:
    """A job running in a pipeline worker: what every kind keeps of it (each adds its own fields)."""

    job: Job
    entry_id: bytes
    seq: int = 0
    cancelled: bool = False
    streamed: bool = False  # something went out: the job cannot be handed to another worker
    received: float = field(default_factory=time.time)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def summary(self) -> dict[str, float | int | None]:
        return {"queue_ms": round((self.received - self.job.created) * 1000, 1),
                "total_ms": round((time.time() - self.job.created) * 1000, 1)}


class PipelineJob(JobState, Protocol):
    received: float  # when the worker took it from the stream (unix s)


class PipelineWorker(BaseWorker):
    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self._tasks: set[asyncio.Task[None]] = set()

    def _accept(self, state: PipelineJob, outbox: Outbox) -> None:
        """The job runs here from now on: `accepted`, its status RUNNING, its time in the queue observed."""
        job = state.job
        self.running[job.id] = state
        queue_ms = (state.received - job.created) * 1000
        outbox.publish(job.reply_to, Accepted(job=job.id, seq=state.next_seq(), worker=self.id, prompt_tokens=0,
                                              queue_ms=queue_ms))
        outbox.set_status(job.id, status=JobStatus.RUNNING, worker=self.id, streamed=0)
        outbox.observe("queue", queue_ms)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


