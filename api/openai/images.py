"""/images/generations and /images/edits: limits checked here, the work done by an image worker.

Uploads go to Redis as short-lived blobs the job names; results come back the same way (the Done event names
the keys; this process reads them once and deletes them).
"""
from __future__ import annotations

import base64
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from api.http.sse import frame
from api.http.status import CLIENT_CLOSED
from api.openai.limits import check_image_prompts, require_media_type
from api.openai.media import check_image
from api.openai.protocol import ImageData, ImageEditRequest, ImageRequest, ImagesResponse, ImageStreamEvent, StreamError
from api.openai.serving import parse_body, stream_response, validation_error
from api.ops.metrics import Record
from api.queue.client import ClientGone, Generation, JobClient, deadline, error_of, request_id
from api.queue.registry import Registry, Servable
from common.errors import OvqError, exc_text, internal
from common.events import CANCELLED, DONE, ERROR, PROGRESS
from common.jobs import ImageParams, Job
from common.modelcard import ImageLimits
from common.models.config import parse_size
from common.servable import ServableType
from common.settings import Settings

NO_USAGE = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
            "input_tokens_details": {"image_tokens": 0, "text_tokens": 0}}


def check_limits(body: ImageRequest, limits: ImageLimits) -> tuple[int | None, int | None]:
    """OVMS's image node limits; returns the requested (width, height) or (None, None) for the default."""
    if body.n > limits.max_num_images_per_prompt:
        raise OvqError(f"n value {body.n} exceeds max_num_images_per_prompt ({limits.max_num_images_per_prompt})",
                       param="n")
    steps = body.num_inference_steps
    if steps is not None and steps > limits.max_num_inference_steps:
        raise OvqError(f"num_inference_steps value {steps} exceeds max_num_inference_steps "
                       f"({limits.max_num_inference_steps})", param="num_inference_steps")
    if body.size in (None, "auto"):
        return None, None
    try:
        width, height = parse_size(body.size)
    except ValueError as exc:
        raise OvqError(str(exc), param="size") from exc
    max_width, max_height = parse_size(limits.max_resolution)
    if width > max_width or height > max_height:
        raise OvqError(f"size {body.size} exceeds max_resolution {limits.max_resolution}", param="size")
    return width, height


def check_lora_weights(body: ImageRequest, adapters: list[str]) -> None:
    """Weights only for the adapters the model serves, and finite."""
    for name, weight in (body.lora_weights or {}).items():
        if name not in adapters:
            served = ", ".join(adapters) or "none"
            raise OvqError(f"lora_weights: `{body.model}` serves no LoRA adapter {name!r} (it serves: {served})",
                           param="lora_weights")
        if not math.isfinite(weight):
            raise OvqError(f"lora_weights: the weight of {name!r} is not a finite number", param="lora_weights")


class ImageServing:
    def __init__(self, jobs: JobClient, registry: Registry, settings: Settings) -> None:
        self.jobs, self.registry, self.settings = jobs, registry, settings

    async def _servable(self, model: str) -> tuple[Servable, ImageLimits]:
        servable = await self.registry.servable(model)
        limits = servable.card.image
        if servable.card.servable_type is not ServableType.IMAGE or limits is None:
            raise OvqError(f"The model `{model}` does not generate images", param="model")
        return servable, limits

    async def generations(self, request: Request) -> Response:
        body = await parse_body(request, ImageRequest)
        servable, limits = await self._servable(body.model)
        job = self._job(body, limits, request_id(request))
        return await self._respond(request, body, servable, job, "image_generation")

    async def edits(self, request: Request) -> Response:
        form = await self._form(request)
        try:
            body = ImageEditRequest.model_validate({k: v for k, v in form.items() if k not in ("image", "mask")})
        except ValidationError as exc:
            raise validation_error(exc) from exc
        servable, limits = await self._servable(body.model)
        if not limits.edits:
            raise OvqError(f"The model `{body.model}` cannot edit images (it has no VAE encoder)", param="model")
        job = self._job(body, limits, request_id(request))
        uploads = {"input": await self._upload(form.get("image"), "image", required=True),
                   "mask": await self._upload(form.get("mask"), "mask", required=False)}
        keys = {name: self.jobs.keys.blob(job.id, name, job.model) for name, data in uploads.items() if data}
        pipe = self.jobs.redis.pipeline(transaction=False)
        for name, key in keys.items():
            pipe.set(key, uploads[name], ex=self.settings.blob_ttl_s)
        await pipe.execute()
        assert job.image is not None
        job.image.strength = body.strength
        job.image.image_key, job.image.mask_key = keys.get("input"), keys.get("mask")
        return await self._respond(request, body, servable, job, "image_edit")

    async def _form(self, request: Request) -> dict[str, Any]:
        require_media_type(request.headers.get("content-type"), "multipart/form-data", request.url.path)
        try:
            form = await request.form(max_part_size=self.settings.max_upload_bytes)
        except (ClientDisconnect, OvqError):  # the client left, or the body guard refused the body
            raise
        except Exception as exc:  # malformed multipart, or a part over the size limit
            raise OvqError(f"could not read the form: {exc_text(exc)}") from exc
        # OpenAI's SDK names a list of images `image[]`; one image is what the pipelines take.
        images = form.getlist("image") + form.getlist("image[]")
        if len(images) > 1:
            raise OvqError("only one image can be edited per request", param="image")
        fields = {k: v for k, v in form.multi_items() if k not in ("image", "image[]")}
        if images:
            fields["image"] = images[0]
        return fields

    async def _upload(self, part: Any, name: str, required: bool) -> bytes | None:
        if part is None:
            if required:
                raise OvqError(f"{name} is required", param=name)
            return None
        if not isinstance(part, UploadFile):
            raise OvqError(f"{name} must be a file", param=name)
        return check_image(await part.read(self.settings.max_upload_bytes + 1), self.settings, name, name)

    def _job(self, body: ImageRequest, limits: ImageLimits, job_id: str) -> Job:
        check_image_prompts(body, self.settings)
        check_lora_weights(body, limits.lora_adapters)
        width, height = check_limits(body, limits)
        fields = body.model_dump(include=set(ImageParams.model_fields) - {"width", "height"}, exclude_none=True)
        params = ImageParams(**fields, width=width, height=height, previews=body.stream)
        return Job(id=job_id, model=body.model, device="", kind="image", prompt=body.prompt, image=params,
                   reply_to=self.jobs.hub.reply_to)

    async def _respond(self, request: Request, body: ImageRequest, servable: Servable, job: Job,
                       kind: str) -> Response:
        record: Record = request.state.record
        record.model = body.model
        ends = deadline(request, self.settings.request_timeout_s)
        async with self.jobs.open(request, [job], servable, ends) as generation:
            headers = {"X-Request-Id": record.request_id}
            if body.stream:
                frames = self._stream(generation, kind, record)
                return stream_response(generation, frames, record, self.jobs.metrics, headers)
            return await self._whole(generation, record, headers)

    async def _images(self, keys: list[str]) -> list[str]:
        if self.jobs.keys.cluster:  # redis-py's cluster pipelines refuse MGET (the keys share their job's slot)
            blobs = await self.jobs.redis.mget(keys)
            await self.jobs.redis.delete(*keys)
        else:
            pipe = self.jobs.redis.pipeline(transaction=False)
            pipe.mget(keys)
            pipe.delete(*keys)
            blobs, _ = await pipe.execute()
        if any(b is None for b in blobs):
            raise internal("the generated images expired before they could be read")
        return [base64.b64encode(b).decode() for b in blobs]

    async def _whole(self, generation: Generation, record: Record, headers: dict[str, str]) -> Response:
        while not generation.finished:
            for event in await generation.events():
                if event["type"] == DONE:
                    record.done(event)
                    data = [ImageData(b64_json=b) for b in await self._images(event["images"])]
                    answer = ImagesResponse(created=int(time.time()), data=data, size=event.get("size"))
                    return Response(answer.model_dump_json(exclude_none=True), media_type="application/json",
                                    headers=headers)
                if event["type"] == ERROR:
                    raise error_of(event, "invalid_request_error")
                if event["type"] == CANCELLED:
                    raise ClientGone()
        raise ClientGone()

    async def _stream(self, generation: Generation, kind: str, record: Record) -> AsyncIterator[bytes]:
        size = "auto"
        try:
            while not generation.finished:
                for event in await generation.events():
                    now = int(time.time())
                    if event["type"] == PROGRESS:
                        partial = ImageStreamEvent(
                            type=f"{kind}.partial_image", b64_json=event.get("preview") or "", created_at=now,
                            size=size, partial_image_index=event["step"] - 1, step=event["step"],
                            total_steps=event["total"], index=event.get("index", 0))
                        yield frame(partial.model_dump_json(exclude_none=True).encode(), partial.type.encode())
                    elif event["type"] == DONE:
                        record.done(event)
                        for index, b64 in enumerate(await self._images(event["images"])):
                            completed = ImageStreamEvent(type=f"{kind}.completed", b64_json=b64, created_at=now,
                                                         size=event.get("size") or size, index=index, usage=NO_USAGE)
                            yield frame(completed.model_dump_json(exclude_none=True).encode(),
                                        completed.type.encode())
                    elif event["type"] == ERROR:
                        record.failed(event["status"], event["error"].get("code"))
                        error = StreamError(error=event["error"]).model_dump_json().encode()
                        yield frame(error, b"error")
        except OvqError as exc:
            record.failed(exc.status, exc.body.code)
            yield frame(StreamError(error=exc.body).model_dump_json().encode(), b"error")
        except ClientGone:
            record.failed(CLIENT_CLOSED)
