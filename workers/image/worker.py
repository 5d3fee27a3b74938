"""The image worker: one generation at a time per pipeline (jobs beyond that wait in the Redis stream).

PNGs do not travel in events: each is stored under a short-lived key (`ovq:blob:{job}:{i}`) that the API
reads once and deletes, so pub/sub messages stay small and Redis memory is bounded by the TTL even when an API
process dies before reading. Previews (at most 128 px) do travel in the progress events.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ErrorBody
from common.events import Cancelled, Done, Error, Progress, Timings
from common.jobs import Job, JobStatus
from common.models.config import ModelConfig
from common.servable import ServableType
from common.settings import Settings
from workers.engine.continuous import error_message
from workers.image.pipelines import ImagePipelines, decode_image, image_limits, latent_preview, to_png
from workers.ops.tracing import JobTimes
from workers.pipeline import PipelineRun, PipelineWorker, pipeline_card
from workers.queue.publisher import Outbox

log = logging.getLogger("ovq.image_worker")


@dataclass
class ImageJob(PipelineRun):
    generated: float | None = None  # when the pipeline's generate() returned (unix s)
    steps: int | None = None  # its denoising steps, as the pipeline counts them


class ImageWorker(PipelineWorker):
    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self.capacity = 1
        self.configure(model)

    def configure(self, model: ModelConfig) -> None:
        device, path = self.device, Path(model.path)
        self.card = pipeline_card(model, device, servable_type=ServableType.IMAGE, image=image_limits(model, path))
        self.pipes = ImagePipelines(model, device)

    async def start_backend(self) -> None:
        await asyncio.to_thread(self.pipes.pipe, "text")

    async def stop_backend(self) -> None:
        for state in self.running.values():
            state.cancelled = True

    def describe(self) -> str:
        return f"IMAGE, {self.card.image.pipeline if self.card.image else ''}"

    def cancel_running(self, job_id: str) -> None:
        self.running[job_id].cancelled = True  # the pipeline's next step callback returns True

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        state = ImageJob(job, entry_id)
        self._accept(state, outbox)
        self._spawn(self._generate(state))

    async def _inputs(self, state: ImageJob) -> tuple[Any, Any]:
        params = state.job.image
        if params is None or params.image_key is None:
            return None, None
        image_bytes, mask_bytes = await self.redis.mget(params.image_key, params.mask_key or params.image_key)
        if image_bytes is None:
            raise ValueError("the uploaded image expired before the job started")
        size = (params.width, params.height) if params.width and params.height else None
        image = decode_image(image_bytes, size)
        if params.mask_key is None:
            return image, None
        return image, decode_image(mask_bytes, (image.shape[2], image.shape[1]), mode="L")

    async def _generate(self, state: ImageJob) -> None:
        job, loop = state.job, asyncio.get_running_loop()
        streamed = bool(job.image and job.image.previews)

        def on_step(step: int, total: int, latent: Any) -> bool:
            state.steps = total
            if state.cancelled:
                return True
            if streamed:  # a unary client sees no progress: publish none
                preview = base64.b64encode(latent_preview(latent)).decode()
                loop.call_soon_threadsafe(self._progress, state, step, total, preview)
            return False

        try:
            image, mask = await self._inputs(state)
            pixels = await asyncio.to_thread(self.pipes.generate, str(job.prompt), job.image, image, mask, on_step)
            state.generated = time.time()
            pngs = [] if state.cancelled else await asyncio.to_thread(lambda: [to_png(p) for p in pixels])
        except Exception as exc:  # GenAI refuses a size or a setting: the request's fault
            message = error_message(exc)
            log.warning("image job %s failed: %s", job.id, message)
            self._end(state, error=message)
            return
        if state.cancelled or not pngs:
            self._end(state)
            return
        keys = [self.keys.blob(job.id, f"image{i}", job.model) for i in range(len(pngs))]
        pipe = self.redis.pipeline(transaction=False)
        for key, png in zip(keys, pngs, strict=True):
            pipe.set(key, png, ex=self.settings.blob_ttl_s)
        await pipe.execute()
        height, width = pixels.shape[1:3]
        self._end(state, images=keys, size=f"{width}x{height}")

    def _progress(self, state: ImageJob, step: int, total: int, preview: str | None) -> None:
        if state.job.id not in self.running:
            return
        outbox = Outbox()
        event = Progress(job=state.job.id, seq=state.next_seq(), step=step + 1, total=total, preview=preview)
        outbox.publish(state.job.reply_to, event)
        if not state.streamed:
            state.streamed = True
            outbox.set_status(state.job.id, streamed=1)
        self.publisher.put(outbox)

    def _end(self, state: ImageJob, images: list[str] | None = None, size: str | None = None,
             error: str | None = None) -> None:
        job, outbox = state.job, Outbox()
        if job.id not in self.running:
            return
        self._job_done(state, outbox)
        summary = state.summary()
        if error is not None:
            body = ErrorBody(message=error)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=400, error=body))
            outbox.set_status(job.id, status=JobStatus.ERROR, error=body.model_dump(), **summary)
        elif images is None:
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status=JobStatus.CANCELLED, **summary)
        else:
            now = time.time()
            timings = Timings(queue_ms=(state.received - job.created) * 1000, total_ms=(now - job.created) * 1000)
            done = Done(job=job.id, seq=state.next_seq(), timings=timings, images=images, size=size)
            outbox.publish(job.reply_to, done)
            outbox.set_status(job.id, status=JobStatus.DONE, result=done.model_dump(mode="json"), **summary)
        if job.traceparent is not None:
            times = JobTimes(state.received, state.received, generated=state.generated, steps=state.steps)
            end = JobStatus.ERROR if error is not None else JobStatus.CANCELLED if images is None else JobStatus.DONE
            published = times.spans(job, self.id, end, 0, 0, time.time())
            if published is not None:
                outbox.sent.append(published)
        self.publisher.put(outbox)
