"""Chat completions and completions: request in, job out, events back as one answer or an SSE stream."""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from api.http.sse import DONE as END
from api.http.sse import PING, Last, SSEResponse, Write
from api.http.status import CLIENT_CLOSED
from api.openai.adapters import resolve
from api.openai.aliases import conversation_key
from api.openai.checks import check_for_model
from api.openai.choices import ChoiceState
from api.openai.formats import ChatFormat, CompletionFormat, Format
from api.openai.guidance import ChatPlan, chat_plan
from api.openai.limits import check_sampling, require_media_type
from api.openai.media import load_image
from api.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from api.openai.resume import Frames, Resumable, resume_point, wants_resumable
from api.openai.templates import render, template_message
from api.ops.metrics import Metrics, Record
from api.queue.affinity import SESSION_HEADER, prefix_digests
from api.queue.client import REQUEST_ID, ClientGone, Generation, JobClient, deadline, error_of, request_id
from api.queue.hub import Express
from api.queue.priority import service_tier
from api.queue.registry import Registry, Servable
from common.errors import OvqError
from common.events import CANCELLED, DELTA, DONE, ERROR, DoneEvent, EventDict
from common.jobs import Job, SamplingParams
from common.redis.client import UNAVAILABLE, redis_away
from common.servable import ServableType

M = TypeVar("M", bound=BaseModel)
TEXT_SERVABLES = (ServableType.LM_CB, ServableType.LM, ServableType.VLM_CB, ServableType.VLM)
VISION_SERVABLES = (ServableType.VLM_CB, ServableType.VLM)


async def parse_body(request: Request, model: type[M]) -> M:
    # The scope's path, not request.url.path: building the URL object costs more than the rest of this check.
    require_media_type(request.headers.get("content-type"), "application/json", request.scope["path"])
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise OvqError(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(data, dict):
        raise OvqError("The request body must be a JSON object")
    # Scheduling reads these of any endpoint's body (api/queue/priority.py, the tenant when keys are off).
    request.state.priority_field, request.state.user_field = data.get("priority"), data.get("user")
    request.state.tier_field = data.get("service_tier")
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    routes = getattr(request.app.state, "aliases", None)
    if routes and isinstance(getattr(body, "model", None), str):  # an alias: from here on the request names its target
        target = routes.route(body.model, conversation_key(data))
        if target is not None:
            body.model = target  # type: ignore[attr-defined]
    return body


def validation_error(exc: ValidationError) -> OvqError:
    """The first problem pydantic found, as a 400 naming the field."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    message = "unsupported field" if first["type"] == "extra_forbidden" else first["msg"]
    return OvqError(f"{param}: {message}" if param else message, param=param)


def sampling_params(body: SamplingRequest, structure: dict[str, Any] | None = None,
                    skip_special_tokens: bool | None = None) -> SamplingParams:
    """The job's parameters. An unset max_tokens stays unset: the worker knows the model's default (its
    max_tokens_default, generation_config.json's max_new_tokens, max_tokens_limit)."""
    values = {name: getattr(body, name) for name in _copied(type(body))}
    values.update(stop=body.stop or [], logprobs=body.top_logprobs_asked, structured=structure, adapter=body.adapter)
    if skip_special_tokens is not None:
        values["skip_special_tokens"] = skip_special_tokens
    return SamplingParams.model_validate(values)


@functools.cache
def _copied(body: type[SamplingRequest]) -> tuple[str, ...]:
    """The job parameters a request's body gives as they are (read by name: `model_dump` of a subset cost more
    than validating the parameters)."""
    return tuple(name for name in SamplingParams.model_fields
                 if name in body.model_fields and name not in ("logprobs", "structured"))


PING_S = 15.0
REDIS_AWAY = redis_away()


class Serving:
    def __init__(self, jobs: JobClient, registry: Registry, metrics: Metrics) -> None:
        self.jobs, self.registry, self.metrics = jobs, registry, metrics
        self.resumable = Resumable(jobs)

    async def _servable(self, body: SamplingRequest) -> Servable:
        check_sampling(body, self.jobs.settings)
        model, body.adapter = await resolve(self.registry, body.model)
        servable = await self.registry.servable(model)
        if servable.card.servable_type not in TEXT_SERVABLES:
            raise OvqError(f"The model `{body.model}` does not generate text", param="model")
        check_for_model(body, servable.card)
        return servable

    async def chat(self, request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        point = resume_point(request)
        if body.stream and point is None and await self.registry.awaiting(body.model):
            return after_card(request, body.model, self.chat, self.registry, self.metrics)
        servable, job, plan = await self.chat_job(request, body)
        if point is not None:
            job.id = point[0]
        fmt = ChatFormat(f"chatcmpl-{job.id}", body.model, body.include_usage,
                         servable.card.reasoning_parser is not None, body.continuous_usage, service_tier(request))
        choices = {(job.id, i): ChoiceState(i, plan.parser(), job.params.logprobs) for i in range(body.n)}
        return await self._respond(request, body, servable, [job], fmt, choices)

    async def chat_job(self, request: Request, body: ChatCompletionRequest) -> tuple[Servable, Job, ChatPlan]:
        """A chat request checked against its model and made into its job (images stored, prompt rendered), with
        the plan its answer is parsed by: `/chat/completions` and `/responses` both start here."""
        servable, plan, prompt = await self.chat_prompt(body)
        card = servable.card
        vision = card.servable_type in VISION_SERVABLES
        urls = [url for m in body.messages for url in m.image_urls()] if vision else []
        if vision and card.device.startswith("NPU") and len(urls) != 1:
            raise OvqError("this NPU vision servable takes exactly one image per request", param="messages")
        # Tool-call markers are often special tokens (<|python_tag|>, [TOOL_CALLS]): the parser must see them.
        skip = False if plan.tool_parser or plan.keeps_special_tokens() else None
        params = sampling_params(body, plan.structure, skip)
        job = self._job(body, servable, "chat", prompt, params, request_id(request))
        job.images = await self._store_images(job.id, urls, job.model)
        self._prefixes(request, body, servable, job)
        return servable, job, plan

    async def chat_prompt(self, body: ChatCompletionRequest) -> tuple[Servable, ChatPlan, str]:
        """A chat request checked against its model, and the prompt its template renders (what the worker
        tokenizes), with the plan its answer is parsed by."""
        servable = await self._servable(body)
        card = servable.card
        vision = card.servable_type in VISION_SERVABLES
        plan = chat_plan(body, card)
        messages = [template_message(m, vision) for m in body.messages]
        kwargs = {**plan.template_kwargs, **({"tools": plan.tools} if plan.tools else {})}
        prompt = render(card.chat_template, messages, card.bos_token, card.eos_token, kwargs)
        plan.opened(prompt)
        return servable, plan, prompt

    async def _store_images(self, job_id: str, urls: list[str], model: str = "") -> list[str]:
        """Fetch and check every image now (a bad one is the request's 400); the worker reads them by key."""
        if not urls:
            return []
        settings = self.jobs.settings
        images = [await load_image(url, settings) for url in urls]
        keys = [self.jobs.keys.blob(job_id, f"chat{i}", model) for i in range(len(images))]
        pipe = self.jobs.redis.pipeline(transaction=False)
        for key, data in zip(keys, images, strict=True):
            pipe.set(key, data, ex=settings.blob_ttl_s)
        await pipe.execute()
        return keys

    async def completions(self, request: Request) -> Response:
        """One job per prompt (OpenAI takes a list of prompts); choice i of prompt p is index p * n + i."""
        body = await parse_body(request, CompletionRequest)
        point = resume_point(request)
        if body.stream and point is None and await self.registry.awaiting(body.model):
            return after_card(request, body.model, self.completions, self.registry, self.metrics)
        servable = await self._servable(body)
        if servable.card.servable_type in VISION_SERVABLES:
            raise OvqError(f"The model `{body.model}` is a vision-language model: use /chat/completions",
                           param="model")
        params = sampling_params(body)
        rid = point[0] if point is not None else request_id(request)
        prompts = body.prompts
        jobs = [self._job(body, servable, "completion", prompt, params, rid if len(prompts) == 1 else f"{rid}-{p}",
                          add_special_tokens=True) for p, prompt in enumerate(prompts)]
        for job in jobs:
            self._prefixes(request, body, servable, job)
        choices = {(job.id, i): ChoiceState(p * body.n + i, None, params.logprobs)
                   for p, job in enumerate(jobs) for i in range(body.n)}
        fmt = CompletionFormat(f"cmpl-{rid}", body.model, body.include_usage, body.continuous_usage)
        return await self._respond(request, body, servable, jobs, fmt, choices)

    def _prefixes(self, request: Request, body: SamplingRequest, servable: Servable, job: Job) -> None:
        """With prefix affinity on: the digests of the job's prompt prefixes, led by the conversation's own key
        (OpenAI's `prompt_cache_key`, else the X-Ovq-Session header) when the client names one."""
        settings = self.jobs.settings
        if not settings.affinity_on(servable.prefix_caching):
            return
        key = (body.model_extra or {}).get("prompt_cache_key")
        if not isinstance(key, str) or not key:
            key = request.headers.get(SESSION_HEADER) or None
        job.prefixes = prefix_digests(job.prompt, settings.affinity_block_chars, key) or None

    def _job(self, body: SamplingRequest, servable: Servable, kind: str, prompt: Any, params: SamplingParams,
             job_id: str, add_special_tokens: bool = False) -> Job:
        return Job(id=job_id, model=servable.model, device=servable.card.device, kind=kind, prompt=prompt,
                   add_special_tokens=add_special_tokens, params=params, reply_to=self.jobs.hub.reply_to,
                   keep_alive=body.keep_alive)

    def open(self, request: Request, model: str, servable: Servable, jobs: list[Job],
             stream: bool = False) -> Generation:
        """The jobs' generation (see `JobClient.open`), under the request's deadline, counted as `model`'s."""
        request.state.record.model = model
        return self.jobs.open(request, jobs, servable, deadline(request, self.jobs.settings.request_timeout_s),
                              stream)

    async def _respond(self, request: Request, body: SamplingRequest, servable: Servable, jobs: list[Job],
                       fmt: Format, choices: dict[tuple[str, int], ChoiceState]) -> Response:
        record: Record = request.state.record
        point = resume_point(request)
        if point is not None:  # a resumable stream's client is back: the rest of it, from the job's journal
            if not body.stream or len(jobs) != 1:
                raise OvqError("Last-Event-ID resumes a streamed request of one prompt", param="Last-Event-ID")
            return await self.resumable.resume(request, body.model, Frames(fmt, choices), *point)
        resumable = wants_resumable(request, body.stream, jobs)
        if resumable:
            self.resumable.hold(jobs[0])
        async with self.open(request, body.model, servable, jobs, body.stream) as generation:
            headers = {"X-Request-Id": record.request_id}
            if resumable:
                frames = self.resumable.live(generation, Frames(fmt, choices))
                return stream_response(generation, frames, record, self.metrics, headers)
            if body.stream:
                frames = self._stream(generation, fmt, choices, record)
                return stream_response(generation, frames, record, self.metrics, headers)
            return await self._whole(generation, fmt, choices, record, headers)

    async def _whole(self, generation: Generation, fmt: Format, choices: dict[tuple[str, int], ChoiceState],
                     record: Record, headers: dict[str, str]) -> Response:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        while not generation.finished:
            for event in await generation.events():
                kind = event["type"]
                if kind == DELTA:
                    choices[event["job"], event.get("index", 0)].add(event)
                elif kind == DONE:
                    add_usage(usage, event)
                    record.done(event)
                    finish_choices(choices, event)
                elif kind == ERROR:
                    raise error_of(event, "server_error")
                elif kind == CANCELLED:
                    raise ClientGone()
        ordered = sorted(choices.values(), key=lambda c: c.index)
        record.outcome = ordered[0].finish_reason(bool(ordered[0].parsed().tool_calls)) or "stop"
        return Response(fmt.whole(ordered, usage), media_type="application/json", headers=headers)

    async def _stream(self, generation: Generation, fmt: Format, choices: dict[tuple[str, int], ChoiceState],
                      record: Record) -> AsyncIterator[bytes]:
        """SSE frames, one write per wake-up: whatever arrived meanwhile goes out together (a plain choice's texts
        merged into one chunk). Workers already send a choice's text at most once per `stream_interval_ms`, so
        the API's cost follows those events, not tokens. A stream whose jobs wait for a worker (none live) has its
        headers out already: keep-alives until every job is accepted, then the frames."""
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        last = time.monotonic()
        tail = b""  # the last frames: they go out with `[DONE]` and the end of the body, in one write
        try:
            if generation.pending:
                yield PING  # the first byte: a client's read timeout starts over with each keep-alive
                while not await generation.starting():
                    if time.monotonic() - last >= PING_S:
                        last = time.monotonic()
                        yield PING
            fmt.started(sum(event["prompt_tokens"] for event in generation.accepted.values()))
            first = fmt.first(sorted(choices.values(), key=lambda c: c.index))
            if first:
                yield first
            with generation.express(lambda write: self._express(write, generation, fmt, choices)):
                while not generation.finished:
                    events = await generation.events()
                    out = self._frames(events, fmt, choices, record, usage, generation)
                    if generation.finished:
                        tail = out
                        break
                    now = time.monotonic()
                    if out:
                        last = now
                        yield out
                    elif now - max(last, generation.inbox.last) >= PING_S:  # idle: keep proxies open
                        last = now
                        yield PING
            if fmt.include_usage:
                tail += fmt.usage(usage)
            if not record.outcome:
                finished = sorted(choices.values(), key=lambda c: c.index)[0]
                record.outcome = finished.finish_reason(finished.called) or "stop"
        except OvqError as exc:
            record.failed(exc.status, exc.body.code)
            tail = b"data: " + orjson.dumps({"error": exc.body.model_dump()}) + b"\n\n"
        except UNAVAILABLE:
            record.failed(503)
            tail = b"data: " + orjson.dumps({"error": REDIS_AWAY.body.model_dump()}) + b"\n\n"
        except ClientGone:
            record.failed(CLIENT_CLOSED)
            return
        yield Last(tail + END)

    @staticmethod
    def _express(write: Write, generation: Generation, fmt: Format,
                 choices: dict[tuple[str, int], ChoiceState]) -> Express | None:
        """The hub writes a plain choice's text delta itself, in the order it came, when nothing is queued ahead
        of it: no task wake-up, no batching step, one write. Anything else (a finish, tool calls, log-probabilities,
        a terminal event, a slow client) declines and takes the loop above."""
        if fmt.running is not None:  # usage on every chunk: each delta is counted in `_frames`
            return None

        def express(event: EventDict) -> bool:
            if event["type"] != DELTA or event.get("finish_reason") or not generation.quiet:
                return False
            choice = choices.get((event["job"], event.get("index", 0)))
            if choice is None or not choice.plain:
                return False
            return write(fmt.plain(choice, event["text"], None))

        return express

    @staticmethod
    def _frames(events: list[EventDict], fmt: Format, choices: dict[tuple[str, int], ChoiceState],
                record: Record, usage: dict[str, int], generation: Generation) -> bytes:
        out: list[bytes] = []
        plain: dict[ChoiceState, list[str]] = {}  # texts of plain choices, merged into one chunk each

        def flush() -> None:
            for choice, texts in plain.items():
                out.append(fmt.plain(choice, "".join(texts), None))
            plain.clear()

        for event in events:
            kind = event["type"]
            if kind == DELTA:
                fmt.count(event)
                choice = choices[event["job"], event.get("index", 0)]
                if choice.plain and not event.get("finish_reason"):
                    plain.setdefault(choice, []).append(event["text"])
                    continue
                texts = plain.pop(choice, None)
                if texts:
                    event = {**event, "text": "".join(texts) + event["text"]}
                out.append(fmt.chunk(choice, event))
            elif kind == DONE:
                add_usage(usage, event)
                record.done(event)
            elif kind == ERROR:
                flush()
                record.failed(event["status"], event["error"].get("code"))
                out.append(b"data: " + orjson.dumps({"error": event["error"]}) + b"\n\n")
                generation.end()  # the response ends here; close() cancels its other jobs
            elif kind == CANCELLED:
                raise ClientGone()
        flush()
        return b"".join(out)


def stream_response(generation: Generation, frames: AsyncIterator[bytes], record: Record, metrics: Metrics,
                    headers: dict[str, str], on_close: Callable[[], Awaitable[None]] | None = None) -> SSEResponse:
    """The generation's frames as SSE. The stream takes the generation over: its end (the last frame written, or
    the client gone) closes it, runs `on_close` and finishes the request's record."""
    generation.hand_over()
    record.streaming = True

    async def close() -> None:
        if not generation.finished and not record.outcome:
            record.failed(CLIENT_CLOSED)  # the client left mid-stream
        await generation.close()
        if on_close is not None:
            await on_close()
        metrics.finish(record)

    return SSEResponse(frames, close, headers, generation.writes_to)


def after_card(request: Request, model: str, handler: Callable[[Request], Awaitable[Response]],
               registry: Registry, metrics: Metrics) -> SSEResponse:
    """A stream for an expected model no worker has announced yet (none ever, or not within the card TTL): its
    headers and keep-alives go out now, while it waits for the card its request is validated and rendered with
    (within `queue_timeout_s` of its start, the same bound as its wait for a worker); then `handler` runs it (the
    body is read already) and its frames follow. A refusal on the way is the stream's error event."""
    record: Record = request.state.record
    record.streaming = True
    inner: list[SSEResponse] = []
    direct: list[Write] = []

    async def frames() -> AsyncIterator[bytes]:
        yield PING
        gone = asyncio.ensure_future(_disconnect(request))
        card = asyncio.ensure_future(registry.servable(model, record.started))
        try:
            while not card.done():
                await asyncio.wait([card, gone], timeout=PING_S, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    raise ClientGone()
                if not card.done():
                    yield PING
            card.result()
            gone.cancel()
            response = await handler(request)
        except OvqError as exc:
            record.failed(exc.status, exc.body.code)
            yield Last(b"data: " + orjson.dumps({"error": exc.body.model_dump()}) + b"\n\n" + END)
            return
        except UNAVAILABLE:
            record.failed(503)
            yield Last(b"data: " + orjson.dumps({"error": REDIS_AWAY.body.model_dump()}) + b"\n\n" + END)
            return
        except ClientGone:
            record.failed(CLIENT_CLOSED)
            return
        finally:
            gone.cancel()
            card.cancel()
        assert isinstance(response, SSEResponse)  # a stream's handler answers with one, or raises
        inner.append(response)
        if direct and response.on_write is not None:
            response.on_write(direct[0])
        async for data in response.frames:
            yield data

    async def close() -> None:
        if inner:
            await inner[0].on_close()  # the inner stream finishes the record
        else:
            metrics.finish(record)

    given = request.headers.get("x-request-id", "")  # the job's id, when the client names it (else made later)
    headers = {"X-Request-Id": given} if REQUEST_ID.fullmatch(given) else None
    return SSEResponse(frames(), close, headers, direct.append)


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def add_usage(usage: dict[str, int], event: DoneEvent) -> None:
    for name, value in (event.get("usage") or {}).items():
        usage[name] = usage.get(name, 0) + value


def finish_choices(choices: dict[tuple[str, int], ChoiceState], done: DoneEvent) -> None:
    reasons = done.get("finish_reasons") or [done.get("finish_reason", "stop")]
    for index, reason in enumerate(reasons):
        choice = choices.get((done["job"], index))
        if choice is not None:
            choice.finish = choice.finish or reason
