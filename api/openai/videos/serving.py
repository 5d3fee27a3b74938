"""`/videos`: OpenAI's Videos API through the queue, on a video worker (workers/video/).

Creating a video checks it against the model's limits, records it (store.py) and queues its job detached from the
request (journaled, run whatever its client does); the answer is the video `queued`. Any API process then tells
its state, serves its content and deletes it (a running job is cancelled at its next denoising step).
"""
from __future__ import annotations

import asyncio
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from api.http.auth import caller_of
from api.http.sse import DONE as END
from api.http.sse import Last, SSEResponse, frame
from api.openai.serving import parse_body, validation_error
from api.openai.videos.protocol import VARIANTS, RemixRequest, VideoDeleted, VideoList, VideoRequest
from api.openai.videos.store import Fold, VideoRecord, VideoStore
from api.queue.client import JobClient
from api.queue.journal import JournalBroken, paced
from api.queue.registry import Servable
from common.errors import OvqError, exc_text
from common.events import EventDict
from common.jobs import Job, VideoParams
from common.modelcard import VideoLimits
from common.models.config import parse_size
from common.servable import ServableType

REPLY_TO = "background"  # read from its journal, as a background response is (no API process subscribes)
POLL_AFTER_MS = "500"  # what `openai-poll-after-ms` tells the SDK's poll helper while a video is not done
# LTX-Video: sizes in multiples of 32 pixels, clips of 8k+1 frames (its VAE packs 8 frames in one latent frame).
SIZE_STEP, FRAME_STEP = 32, 8
DEFAULT_SIZE = "704x480"  # LTX-Video's own resolution, where the models file names no default_resolution
STAGES = {"queued": 0, "in_progress": 1, "completed": 2, "failed": 2}  # a status's place in a video's life


def video_params(body: VideoRequest, limits: VideoLimits, ttl_s: int) -> tuple[int, VideoParams]:
    """The request within the model's limits: its seconds and the job's settings (a seed always: a remix reuses it)."""
    seconds = body.seconds or limits.default_seconds
    if seconds > limits.max_seconds:
        raise OvqError(f"seconds value {seconds} exceeds this model's maximum ({limits.max_seconds})", param="seconds")
    width, height = _size(body.size or limits.default_resolution or DEFAULT_SIZE, limits)
    steps = body.num_inference_steps or limits.default_num_inference_steps
    if steps > limits.max_num_inference_steps:
        raise OvqError(f"num_inference_steps value {steps} exceeds max_num_inference_steps "
                       f"({limits.max_num_inference_steps})", param="num_inference_steps")
    rate = body.frame_rate or limits.frame_rate
    frames = FRAME_STEP * math.ceil(seconds * rate / FRAME_STEP) + 1
    return seconds, VideoParams(width=width, height=height, num_frames=frames, frame_rate=rate,
                                num_inference_steps=steps, guidance_scale=body.guidance_scale,
                                negative_prompt=body.negative_prompt,
                                rng_seed=body.seed if body.seed is not None else secrets.randbits(31), ttl_s=ttl_s)


def _size(size: str, limits: VideoLimits) -> tuple[int, int]:
    try:
        width, height = parse_size(size)
    except ValueError as exc:
        raise OvqError(str(exc), param="size") from exc
    if width % SIZE_STEP or height % SIZE_STEP:
        raise OvqError(f"size {size}: width and height must be multiples of {SIZE_STEP} for "
                       f"{limits.pipeline or 'this model'}", param="size")
    max_width, max_height = parse_size(limits.max_resolution)
    if width > max_width or height > max_height:
        raise OvqError(f"size {size} exceeds max_resolution {limits.max_resolution}", param="size")
    return width, height


class VideoServing:
    def __init__(self, jobs: JobClient, store: VideoStore) -> None:
        self.jobs, self.store, self.settings = jobs, store, jobs.settings
        self._keepers: set[asyncio.Task[None]] = set()

    async def stop(self) -> None:
        for keeper in list(self._keepers):
            keeper.cancel()

    # ---- creating one ----

    async def create(self, request: Request) -> Response:
        body = await self._body(request)
        servable, limits = await self._servable(body.model)
        seconds, params = video_params(body, limits, self.settings.video_ttl_s)
        return await self._start(request, servable, body.prompt, seconds, params, None)

    async def remix(self, request: Request, video_id: str) -> Response:
        """A new video from a stored one's settings and seed, with another prompt."""
        source = await self.store.record(video_id, caller_of(request))  # not found before a bad body: ids are private
        body = await parse_body(request, RemixRequest)
        servable, _ = await self._servable(source.model)
        return await self._start(request, servable, body.prompt, source.seconds, source.params, source.id)

    async def _start(self, request: Request, servable: Servable, prompt: str, seconds: int, params: VideoParams,
                     remixed_from: str | None) -> Response:
        model = servable.card.name
        job = Job(id=uuid.uuid4().hex, model=model, device="", kind="video", prompt=prompt, video=params,
                  reply_to=REPLY_TO)
        await self.jobs.detached(request, job)
        record = VideoRecord(f"video_{job.id}", job.id, model, prompt, seconds, params, int(time.time()),
                             caller_of(request).tenant, remixed_from)
        await self.store.create(record)
        await self.jobs.registry.enqueue(servable, job)
        request.state.record.request_id, request.state.record.model = job.id, model
        keeper = asyncio.ensure_future(self._keep(record))
        self._keepers.add(keeper)
        keeper.add_done_callback(self._keepers.discard)
        return _json(Fold(record, self.settings.video_ttl_s), {"X-Request-Id": job.id})

    async def _keep(self, record: VideoRecord) -> None:
        """Follow the job to its end and write it to the record (another API process does if this one dies)."""
        fold = Fold(record, self.settings.video_ttl_s)
        try:
            async for events in self.store.journal.follow(record.job, self.settings.video_stall_s, block=False,
                                                          model=record.model):
                fold.feed(events, time.time())
        except JournalBroken as exc:
            fold.fail(exc.body, time.time())
        except asyncio.CancelledError:
            return
        await self.store.settle(fold)

    async def _body(self, request: Request) -> VideoRequest:
        """A form (the openai SDK sends one) or JSON; `input_reference` refused: GenAI has no image-to-video."""
        if request.headers.get("content-type", "").startswith("application/json"):
            return await parse_body(request, VideoRequest)
        try:
            form = await request.form(max_part_size=self.settings.max_upload_bytes)
        except (ClientDisconnect, OvqError):
            raise
        except Exception as exc:  # malformed multipart, or a part over the size limit
            raise OvqError(f"could not read the form: {exc_text(exc)}") from exc
        if "input_reference" in form:
            raise OvqError("input_reference: image-to-video is not served: OpenVINO GenAI 2026.4's Text2VideoPipeline "
                           "takes no image", param="input_reference", code="unsupported_parameter")
        fields: dict[str, Any] = {k: v for k, v in form.items() if not isinstance(v, UploadFile)}
        try:
            return VideoRequest.model_validate(fields)
        except ValidationError as exc:
            raise validation_error(exc) from exc

    async def _servable(self, model: str | None) -> tuple[Servable, VideoLimits]:
        if model is None:
            model = await self._only_video_model()
        servable = await self.jobs.registry.servable(model)
        limits = servable.card.video
        if servable.card.servable_type is not ServableType.VIDEO or limits is None:
            raise OvqError(f"The model `{model}` does not generate videos", param="model")
        return servable, limits

    async def _only_video_model(self) -> str:
        """A request without `model` (OpenAI's default is theirs): the one video model served, if there is one."""
        listed = await self.jobs.registry.models()
        videos = [name for name, card in listed.items() if card is not None
                  and card.servable_type is ServableType.VIDEO]
        if len(videos) != 1:
            served = ", ".join(sorted(videos)) or "none"
            raise OvqError(f"model is required: name one of the video models served ({served})", param="model")
        return videos[0]

    # ---- reading one, from any API process ----

    async def retrieve(self, request: Request, video_id: str) -> Response:
        fold = await self.store.current(await self.store.record(video_id, caller_of(request)))
        return _json(fold, {} if fold.ended else {"openai-poll-after-ms": POLL_AFTER_MS})

    async def list(self, request: Request) -> Response:
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise OvqError(f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.", param="order",
                           code="invalid_value")
        limit = _limit(query.get("limit"))
        caller = caller_of(request)
        ids, more = await self.store.page(caller, limit, order, query.get("after"))
        videos = []
        for video_id in ids:
            try:
                videos.append((await self.store.current(await self.store.record(video_id, caller))).video)
            except OvqError:  # expired or deleted since the page was read
                continue
        page = VideoList(data=videos, first_id=ids[0] if ids else None, last_id=ids[-1] if ids else None,
                         has_more=more)
        return Response(page.model_dump_json(), media_type="application/json")

    async def events(self, request: Request, video_id: str) -> Response:
        """`GET /videos/{id}/events`: the video object as an SSE event each time its status or progress changes
        (`video.queued`, `video.in_progress`, then `video.completed` or `video.failed`), then `[DONE]`."""
        fold = await self.store.current(await self.store.record(video_id, caller_of(request)))
        return SSEResponse(self._frames(request, fold), _nothing, {"X-Request-Id": fold.record.job})

    async def _frames(self, request: Request, fold: Fold) -> AsyncIterator[bytes]:
        shown = _stage(fold)
        first = _frame(fold)
        if fold.ended:
            yield Last(first + END)
            return
        yield first

        def render(events: list[EventDict]) -> bytes:
            nonlocal shown
            fold.feed(events, time.time())
            if _stage(fold) <= shown:  # replayed from the journal's start: only what the client has not seen
                return b""
            shown = _stage(fold)
            return _frame(fold)

        record = fold.record
        fold = Fold(record, self.settings.video_ttl_s)  # the journal is read again from its start
        try:
            async for out in paced(self.store.journal, record.job, self.settings.video_stall_s, render,
                                   lambda: fold.ended, request.is_disconnected, model=record.model):
                if type(out) is Last:
                    await self.store.settle(fold)
                    out = Last(out + END)
                yield out
        except JournalBroken as exc:
            fold.fail(exc.body, time.time())
            await self.store.settle(fold)
            yield Last(_frame(fold) + END)

    async def content(self, request: Request, video_id: str) -> Response:
        variant = request.query_params.get("variant", "video")
        if variant not in VARIANTS:
            raise OvqError(f"variant {variant!r} is not served: one of {', '.join(VARIANTS)}", param="variant",
                           code="invalid_value")
        fold = await self.store.current(await self.store.record(video_id, caller_of(request)))
        if fold.video.status != "completed":
            raise OvqError(f"Video '{video_id}' is {fold.video.status}: its content exists once it is completed.",
                           param="video_id", code="video_not_ready")
        data = await self.store.content(fold, variant)
        return Response(data, media_type="video/mp4" if variant == "video" else "image/webp")

    async def delete(self, request: Request, video_id: str) -> Response:
        """Cancel a running job (at its next denoising step) and delete the video and its content."""
        fold = await self.store.current(await self.store.record(video_id, caller_of(request)))
        if not fold.ended:
            await self.jobs.cancel([fold.record.job], fold.record.model)
        await self.store.delete(fold)
        return Response(VideoDeleted(id=video_id).model_dump_json(), media_type="application/json")


def _stage(fold: Fold) -> tuple[int, int]:
    """How far a video has come: its status in life order, then its progress."""
    return STAGES[fold.video.status], fold.video.progress


def _frame(fold: Fold) -> bytes:
    return frame(fold.video.model_dump_json().encode(), f"video.{fold.video.status}".encode())


async def _nothing() -> None:
    return None


def _json(fold: Fold, headers: dict[str, str]) -> Response:
    return Response(fold.video.model_dump_json(), media_type="application/json", headers=headers)


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise OvqError(f"Invalid 'limit': expected an integer from 1 to 100, got '{value}'.", param="limit",
                       code="invalid_value")
    return int(value)


router = APIRouter()


def _videos(request: Request) -> VideoServing:
    return request.app.state.videos


@router.get("/videos")
async def list_videos(request: Request) -> Response:
    return await _videos(request).list(request)


@router.get("/videos/{video_id}")
async def retrieve(request: Request, video_id: str) -> Response:
    return await _videos(request).retrieve(request, video_id)


@router.get("/videos/{video_id}/events")
async def events(request: Request, video_id: str) -> Response:
    return await _videos(request).events(request, video_id)


@router.get("/videos/{video_id}/content")
async def content(request: Request, video_id: str) -> Response:
    return await _videos(request).content(request, video_id)


@router.delete("/videos/{video_id}")
async def delete(request: Request, video_id: str) -> Response:
    return await _videos(request).delete(request, video_id)
