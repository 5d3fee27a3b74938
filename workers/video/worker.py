"""The video worker: one generation at a time (jobs beyond that wait in the Redis stream).

A video job is journaled and runs whatever its client does (the Videos API is asynchronous). Its progress events
never mark it `streamed`: a worker that dies mid-job leaves it to be run again from the start by another (GenAI's
Text2VideoPipeline takes no saved latents), and the API keeps the progress it reports from going backwards. The MP4
and its thumbnail are stored under `Keys.video_content` for the job's `ttl_s`; the `done` event names them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import ErrorBody
from common.events import Cancelled, Done, Error, Progress, Timings, Unreadable, read_batch
from common.fairness import video_work
from common.jobs import Job, JobStatus
from common.models.config import ModelConfig
from common.redis.client import UNAVAILABLE
from common.servable import ServableType
from common.settings import Settings
from workers.engine.continuous import error_message
from workers.pipeline import PipelineRun, PipelineWorker, pipeline_card
from workers.queue.publisher import Outbox
from workers.video.pipelines import VideoPipeline, encode_mp4, thumbnail, video_limits

log = logging.getLogger("ovq.video_worker")


@dataclass
class VideoJob(PipelineRun):
    """Never `streamed`: a video job that lost its worker runs again from its start."""

    phases: dict[str, float] = field(default_factory=dict)  # where its time went (VideoPipeline.generate, MP4)

    def summary(self) -> dict[str, float | int | None]:
        """Its times, and its cost in its tenant's fair share: its work, known from its settings."""
        assert self.job.video is not None
        return {**super().summary(), "cost": video_work(self.job.video), **self.phases}


@dataclass
class Output:
    """What a finished job made: its content's keys and size, or why it made nothing."""

    video: str | None = None
    thumbnail: str | None = None
    size: str | None = None
    error: str | None = None


class VideoWorker(PipelineWorker):
    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self.capacity = 1
        self.configure(model)

    def configure(self, model: ModelConfig) -> None:
        device, path = self.device, Path(model.path)
        self.card = pipeline_card(model, device, servable_type=ServableType.VIDEO, video=video_limits(model, path))
        self.pipe = VideoPipeline(model, device)

    async def start_backend(self) -> None:
        await asyncio.to_thread(self.pipe.load)

    async def stop_backend(self) -> None:
        for state in self.running.values():
            state.cancelled = True

    def describe(self) -> str:
        return f"VIDEO, {self.card.video.pipeline if self.card.video else ''}"

    def cancel_running(self, job_id: str) -> None:
        self.running[job_id].cancelled = True  # the pipeline's next step callback returns True

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        state = VideoJob(job, entry_id)
        self.running[job.id] = state  # held from now on: a cancel or a drain finds it
        self._spawn(self._generate(state))

    async def _journaled(self, job: Job) -> int:
        """The last event number in the job's journal: a job run again after its worker died numbers on from it,
        so a reader sees one sequence (a second `accepted`, then the new run's steps)."""
        last = await self.redis.xrevrange(self.keys.journal(job.id, job.model), count=1)
        return read_batch(last[0][1][b"e"])[-1]["seq"] if last else 0

    async def _generate(self, state: VideoJob) -> None:
        job, loop = state.job, asyncio.get_running_loop()
        assert job.video is not None
        try:
            state.seq = await self._journaled(job)
        except (*UNAVAILABLE, Unreadable) as exc:
            log.warning("video job %s: its journal could not be read (%s); numbering its events from 1", job.id, exc)
        outbox = Outbox()
        self._accept(state, outbox)
        self.publisher.put(outbox)

        def on_step(step: int, total: int, latent: Any) -> bool:
            if state.cancelled:
                return True
            loop.call_soon_threadsafe(self._progress, state, step, total)
            return False

        try:
            frames, state.phases = await asyncio.to_thread(self.pipe.generate, str(job.prompt), job.video, on_step)
            generated = time.perf_counter()
            output = Output() if state.cancelled else await self._store(job, frames)
            state.phases["mp4_encode_ms"] = round((time.perf_counter() - generated) * 1000, 1)
        except Exception as exc:  # GenAI refuses a size or a setting: the request's fault
            output = Output(error=error_message(exc))
            log.warning("video job %s failed: %s", job.id, output.error)
        self._end(state, output)

    async def _store(self, job: Job, frames: Any) -> Output:
        assert job.video is not None
        mp4 = await asyncio.to_thread(encode_mp4, frames, job.video.frame_rate)
        if len(mp4) > self.settings.max_video_bytes:
            return Output(error=f"the video is {len(mp4)} bytes, over this deployment's max_video_bytes "
                                f"({self.settings.max_video_bytes})")
        webp = await asyncio.to_thread(thumbnail, frames[0])
        keys = {variant: self.keys.video_content(job.id, variant, job.model) for variant in ("video", "thumbnail")}
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(keys["video"], mp4, ex=job.video.ttl_s)
        pipe.set(keys["thumbnail"], webp, ex=job.video.ttl_s)
        await pipe.execute()
        height, width = frames.shape[1:3]
        return Output(video=keys["video"], thumbnail=keys["thumbnail"], size=f"{width}x{height}")

    def _progress(self, state: VideoJob, step: int, total: int) -> None:
        if state.job.id not in self.running:
            return
        outbox = Outbox()
        outbox.publish(state.job.reply_to, Progress(job=state.job.id, seq=state.next_seq(), step=step + 1,
                                                    total=total))
        self.publisher.put(outbox)

    def _end(self, state: VideoJob, output: Output) -> None:
        job, outbox = state.job, Outbox()
        if job.id not in self.running:
            return
        self._job_done(state, outbox)
        summary = state.summary()
        if output.error is not None:
            body = ErrorBody(message=output.error)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=400, error=body))
            outbox.set_status(job.id, status=JobStatus.ERROR, error=body.model_dump(), **summary)
        elif output.video is None:
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status=JobStatus.CANCELLED, **summary)
        else:
            now = time.time()
            timings = Timings(queue_ms=(state.received - job.created) * 1000, total_ms=(now - job.created) * 1000)
            done = Done(job=job.id, seq=state.next_seq(), timings=timings, video=output.video,
                        thumbnail=output.thumbnail, size=output.size)
            outbox.publish(job.reply_to, done)
            outbox.set_status(job.id, status=JobStatus.DONE, result=done.model_dump(mode="json"), **summary)
        self.publisher.put(outbox)
