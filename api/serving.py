"""Chat completions and completions: request in, job out, events back as one answer or an SSE stream."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.checks import check_for_model
from api.choices import ChoiceState
from api.formats import ChatFormat, CompletionFormat, Format
from api.guidance import chat_plan
from api.jobs import ClientGone, Generation, JobClient
from api.limits import check_sampling, require_media_type
from api.media import load_image
from api.metrics import Metrics
from api.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest, UsageInfo
from api.registry import Registry, Servable
from api.templates import render, template_message
from common.errors import OvqError
from common.jobs import Job, SamplingParams
from common.modelcard import ModelCard
from common.servable import ServableType

M = TypeVar("M", bound=BaseModel)
TEXT_SERVABLES = (ServableType.LM_CB, ServableType.LM, ServableType.VLM_CB, ServableType.VLM)
VISION_SERVABLES = (ServableType.VLM_CB, ServableType.VLM)


async def parse_body(request: Request, model: type[M]) -> M:
    require_media_type(request.headers.get("content-type"), "application/json", request.url.path)
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise OvqError(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(data, dict):
        raise OvqError("The request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def validation_error(exc: ValidationError) -> OvqError:
    """The first problem pydantic found, as a 400 naming the field."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    message = "unsupported field" if first["type"] == "extra_forbidden" else first["msg"]
    return OvqError(f"{param}: {message}" if param else message, param=param)


def sampling_params(body: SamplingRequest, card: ModelCard, structure: dict[str, Any] | None = None,
                    skip_special_tokens: bool | None = None) -> SamplingParams:
    values = body.model_dump(include=set(SamplingParams.model_fields) - {"logprobs", "structured"})
    values.update(stop=body.stop or [], logprobs=body.top_logprobs_asked, structured=structure)
    if values["max_tokens"] is None:
        values["max_tokens"] = card.max_tokens_limit
    if skip_special_tokens is not None:
        values["skip_special_tokens"] = skip_special_tokens
    return SamplingParams.model_validate(values)


class Serving:
    def __init__(self, jobs: JobClient, registry: Registry, metrics: Metrics) -> None:
        self.jobs, self.registry, self.metrics = jobs, registry, metrics

    async def _servable(self, body: SamplingRequest) -> Servable:
        check_sampling(body, self.jobs.settings)
        servable = await self.registry.servable(body.model)
        if servable.card.servable_type not in TEXT_SERVABLES:
            raise OvqError(f"The model `{body.model}` does not generate text", param="model")
        check_for_model(body, servable.card)
        return servable

    async def chat(self, request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        servable = await self._servable(body)
        card = servable.card
        vision = card.servable_type in VISION_SERVABLES
        urls = [url for m in body.messages for url in m.image_urls()] if vision else []
        if vision and card.device.startswith("NPU") and len(urls) != 1:
            raise OvqError("this NPU vision servable takes exactly one image per request", param="messages")
        plan = chat_plan(body, card)
        messages = [template_message(m, vision) for m in body.messages]
        kwargs = {**plan.template_kwargs, **({"tools": plan.tools} if plan.tools else {})}
        prompt = render(card.chat_template, messages, card.bos_token, card.eos_token, kwargs)
        plan.opened(prompt)
        # Tool-call markers are often special tokens (<|python_tag|>, [TOOL_CALLS]): the parser must see them.
        skip = False if plan.tool_parser else None
        params = sampling_params(body, card, plan.structure, skip)
        job = self._job(body, servable, "chat", prompt, params)
        job.images = await self._store_images(job.id, urls)
        fmt = ChatFormat(f"chatcmpl-{job.id}", body.model)
        choices = [ChoiceState(i, plan.parser(), params.logprobs) for i in range(body.n)]
        return await self._respond(request, body, servable, job, fmt, choices)

    async def _store_images(self, job_id: str, urls: list[str]) -> list[str]:
        """Fetch and check every image now (a bad one is the request's 400); the worker reads them by key."""
        if not urls:
            return []
        settings = self.jobs.settings
        images = [await load_image(url, settings) for url in urls]
        keys = [self.jobs.keys.blob(job_id, f"chat{i}") for i in range(len(images))]
        pipe = self.jobs.redis.pipeline(transaction=False)
        for key, data in zip(keys, images, strict=True):
            pipe.set(key, data, ex=settings.blob_ttl_s)
        await pipe.execute()
        return keys

    async def completions(self, request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        servable = await self._servable(body)
        if servable.card.servable_type in VISION_SERVABLES:
            raise OvqError(f"The model `{body.model}` is a vision-language model: use /chat/completions",
                           param="model")
        params = sampling_params(body, servable.card)
        job = self._job(body, servable, "completion", body.prompt, params, add_special_tokens=True)
        choices = [ChoiceState(i, None, params.logprobs) for i in range(body.n)]
        fmt = CompletionFormat(f"cmpl-{job.id}", body.model)
        return await self._respond(request, body, servable, job, fmt, choices)

    def _job(self, body: SamplingRequest, servable: Servable, kind: str, prompt: Any, params: SamplingParams,
             add_special_tokens: bool = False) -> Job:
        return Job(model=body.model, device=servable.card.device, kind=kind, prompt=prompt,
                   add_special_tokens=add_special_tokens, params=params, reply_to=self.jobs.hub.reply_to)

    async def _respond(self, request: Request, body: SamplingRequest, servable: Servable, job: Job,
                       fmt: Format, choices: list[ChoiceState]) -> Response:
        stream = (lambda generation: self._stream(generation, body, fmt, choices)) if body.stream else None
        return await self.jobs.respond(request, job, servable, stream, lambda g, d: self._whole(g, fmt, choices, d))

    async def _whole(self, generation: Generation, fmt: Format, choices: list[ChoiceState],
                     disconnect: asyncio.Future[None]) -> Response:
        async for event in generation.events(disconnect):
            if event.type == "delta":
                choices[event.index].add(event)
            elif event.type == "done":
                self.metrics.observe_done(generation.job.model, event)
                for choice, reason in zip(choices, event.finish_reasons or [event.finish_reason], strict=False):
                    choice.finish = choice.finish or reason
                answer = fmt.whole(choices, UsageInfo(**event.usage.model_dump()))
                await generation.close()
                return Response(answer.model_dump_json(), media_type="application/json")
            elif event.type == "error":
                await generation.close()
                return JSONResponse({"error": event.error.model_dump()}, status_code=event.status)
        raise ClientGone()  # cancelled elsewhere

    async def _stream(self, generation: Generation, body: SamplingRequest, fmt: Format,
                      choices: list[ChoiceState]) -> AsyncIterator[str]:
        try:
            for first in fmt.first(choices):
                yield first.model_dump_json()
            async for event in generation.events():
                if event.type == "delta":
                    chunk = fmt.chunk(choices[event.index], event)
                    if chunk is not None:
                        yield chunk.model_dump_json()
                elif event.type == "done":
                    self.metrics.observe_done(generation.job.model, event)
                    if body.include_usage:
                        yield fmt.usage_chunk(UsageInfo(**event.usage.model_dump())).model_dump_json()
                elif event.type == "error":
                    yield orjson.dumps({"error": event.error.model_dump()}).decode()
            yield "[DONE]"
        except OvqError as exc:
            yield orjson.dumps({"error": exc.body.model_dump()}).decode()
        finally:
            await generation.close()

