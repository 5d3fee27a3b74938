"""The FastAPI application: routes under /v3 with /v1 aliases, health, metrics, OpenAI-shaped errors."""
from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from api.batch import batches, files
from api.batch.lines import BatchLines
from api.http.auth import ApiKeyMiddleware, load_keys
from api.http.body import BodyGuard
from api.http.front import Endpoint, Front
from api.http.hosts import HostGuard
from api.http.status import CLIENT_CLOSED
from api.openai import config as config_routes
from api.openai import lora, tokenize
from api.openai.adapters import adapter_names
from api.openai.aliases import AliasRoutes
from api.openai.config import ConfigFollower
from api.openai.conversations import routes as conversations
from api.openai.conversations.store import ConversationStore
from api.openai.conversations.turns import ConversationTurns
from api.openai.docs import install_docs
from api.openai.encoders import EncoderServing
from api.openai.images import ImageServing
from api.openai.protocol import ModelList, ModelObject
from api.openai.responses import serving as stored_responses
from api.openai.responses.compact import compact as compact_conversation
from api.openai.responses.serving import ResponsesServing
from api.openai.responses.store import ResponseStore
from api.openai.serving import Serving
from api.openai.speech import SpeechServing
from api.openai.videos import serving as videos
from api.openai.videos.serving import VideoServing
from api.openai.videos.store import VideoStore
from api.ops import router as ops_router
from api.ops.metrics import Metrics, Record
from api.ops.refusals import Refusals
from api.ops.tracing import RequestTrace
from api.queue.client import ClientGone, JobClient
from api.queue.heartbeat import ApiHeartbeat
from api.queue.hub import EventHub
from api.queue.registry import Registry
from api.webhooks.delivery import Deliverer, endpoints_by_tenant
from common import heap, tracing
from common.errors import ErrorBody, OvqError, not_found, unavailable
from common.models.sources import has_models
from common.models.watch import ConfigWatch
from common.redis.client import UNAVAILABLE, connect, keys_for, redis_url
from common.settings import Settings, get_settings

log = logging.getLogger("ovq.api")


def error_response(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": body.model_dump()}, status_code=status, headers=headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    api_keys = load_keys(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = connect(settings)
        keys = keys_for(settings)
        hub = EventHub(redis, keys, redis_url(settings), settings.redis_timeout_s)
        await hub.start()
        heartbeat = await ApiHeartbeat(redis, keys, hub.reply_to, settings).start()
        tracing.setup("api", hub.reply_to, settings.tracing)
        watch = ConfigWatch(settings) if has_models(settings) else None
        models = watch.catalog.models if watch is not None else []
        # OVQ_MODELS pins the expected models; else the models file says which exist, and follows its reloads.
        registry = Registry(redis, keys, settings, settings.models or [m.name for m in models],
                            {m.name: m.devices for m in models}, configured=watch is not None and not settings.models)
        refusals = Refusals(redis, keys, settings.stats_ttl_s)
        metrics = Metrics(redis, keys, settings.worker_ttl_s, settings.access_log, refusals, settings.job_ttl_s)
        app.state.registry, app.state.metrics = registry, metrics
        app.state.aliases = AliasRoutes(watch.catalog.aliases if watch is not None else [], metrics.aliased)
        app.state.config = await ConfigFollower(watch, registry, app.state.aliases, redis, keys, settings).start()
        jobs = JobClient(redis, keys, hub, registry, settings, metrics)
        app.state.serving = Serving(jobs, registry, metrics)
        app.state.images = ImageServing(jobs, registry, settings)
        app.state.speech = SpeechServing(jobs, registry, settings)
        app.state.encoders = EncoderServing(jobs, registry, settings)
        app.state.videos = VideoServing(jobs, VideoStore(redis, keys, settings))
        app.state.conversations = ConversationStore(redis, keys, settings)
        app.state.responses = ResponsesServing(app.state.serving, ResponseStore(redis, keys, settings),
                                               ConversationTurns(app.state.conversations))
        deliverer = await Deliverer(redis, keys, settings, endpoints_by_tenant(api_keys[0]), hub.reply_to,
                                    metrics.webhook_counted).start()
        _log_stop_signals(settings)
        heap.settle()
        yield
        await deliverer.stop()
        await app.state.responses.background.stop()
        await app.state.videos.stop()
        await app.state.config.stop()
        await heartbeat.stop()
        await refusals.stop()
        await hub.stop()
        await registry.close()
        await redis.aclose()

    app = FastAPI(title="ovq", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings  # what /tokenize finds model directories by
    _install_error_handlers(app)
    hot = _install_routes(app)
    install_docs(app)
    app.include_router(ops_router)
    keys = api_keys
    app.add_middleware(BodyGuard, settings=settings)
    app.add_middleware(BatchLines, api_keys=keys[0])  # a batch line runs as its batch's owner's
    app.add_middleware(ApiKeyMiddleware, keys=keys)  # refuses before any body is read
    app.add_middleware(HostGuard, settings=settings)  # the browser's requests: host names, cross-site

    def guard(inner: Any) -> Any:  # the same checks, in the same order, for the generation routes
        return HostGuard(ApiKeyMiddleware(BatchLines(BodyGuard(inner, settings=settings), api_keys=keys[0]),
                                          keys=keys), settings=settings)

    return Front(app, hot, guard)  # type: ignore[return-value]


def _log_stop_signals(settings: Settings) -> None:
    """One line saying why this process stops; uvicorn's own handler then drains it."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            log.warning("api process stopping on %s: no new connections, open requests get up to %.0fs",
                        signal.Signals(signum).name, settings.shutdown_grace_s)
            previous(signum, frame)

        signal.signal(sig, handler)


RETRY_AFTER = {429: "1", 503: "2"}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OvqError)
    async def ovq_error(request: Request, exc: OvqError) -> JSONResponse:
        headers = {"Retry-After": RETRY_AFTER[exc.status]} if exc.status in RETRY_AFTER else {}
        if exc.retry_after is not None:
            headers["Retry-After"] = str(exc.retry_after)
        record = getattr(request.state, "record", None)
        if record is not None and record.request_id:
            headers["X-Request-Id"] = record.request_id
        return error_response(exc.status, exc.body, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        return error_response(400, ErrorBody(message=str(first.get("msg")), param=str(first.get("loc"))))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, ErrorBody(message=str(exc.detail), type=kind))

    async def redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # Redis restarting or unreachable: the client may retry. (A handler of its own: Starlette re-raises what
        # reaches the catch-all handler, which would log a traceback for an outage.)
        log.warning("Redis unavailable while serving %s: %s", request.url.path, exc)
        body = ErrorBody(message="The job queue is unavailable right now; retry shortly",
                         type="service_unavailable", code="service_unavailable")
        return error_response(503, body, {"Retry-After": RETRY_AFTER[503]})

    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, redis_unavailable)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s", request.url.path)
        return error_response(500, ErrorBody(message="internal error", type="server_error"))


def _install_routes(app: FastAPI) -> dict[str, Endpoint]:
    """Every route; returns the generation ones by path, for the front layer's direct path."""
    async def chat(request: Request) -> Response:
        return await _counted(request, "chat", request.app.state.serving.chat)

    async def completions(request: Request) -> Response:
        return await _counted(request, "completions", request.app.state.serving.completions)

    async def responses(request: Request) -> Response:
        return await _counted(request, "responses", request.app.state.responses.create)

    async def compact(request: Request) -> Response:
        return await _counted(request, "responses", partial(compact_conversation, request.app.state.responses))

    async def image_generations(request: Request) -> Response:
        return await _counted(request, "images", request.app.state.images.generations)

    async def image_edits(request: Request) -> Response:
        return await _counted(request, "image_edits", request.app.state.images.edits)

    async def create_video(request: Request) -> Response:
        return await _counted(request, "videos", request.app.state.videos.create)

    async def remix_video(request: Request, video_id: str) -> Response:
        return await _counted(request, "videos", lambda r: r.app.state.videos.remix(r, video_id))

    async def transcriptions(request: Request) -> Response:
        return await _counted(request, "transcriptions", request.app.state.speech.transcriptions)

    async def translations(request: Request) -> Response:
        return await _counted(request, "translations", request.app.state.speech.translations)

    async def speech(request: Request) -> Response:
        return await _counted(request, "speech", request.app.state.speech.speech)
    async def embeddings(request: Request) -> Response:
        return await _counted(request, "embeddings", request.app.state.encoders.embeddings)

    async def rerank(request: Request) -> Response:
        return await _counted(request, "rerank", request.app.state.encoders.rerank)

    async def list_models(request: Request) -> ModelList:
        registry = request.app.state.registry
        listed = await registry.models()
        data = [_model_object(name, card) for name, card in listed.items()]
        for name, card in listed.items():
            if card is not None:
                data += [_model_object(a, card) for a in adapter_names(name, await registry.adapters(name, card))]
        data += [ModelObject(id=alias, created=0) for alias in request.app.state.aliases.names]
        return ModelList(data=data)

    async def get_model(request: Request, model: str) -> ModelObject:
        listed = await request.app.state.registry.models()
        if model in listed:
            return _model_object(model, listed[model])
        for name, card in listed.items():
            if card is not None and model in adapter_names(name, await request.app.state.registry.adapters(name, card)):
                return _model_object(model, card)
        if model in request.app.state.aliases.names:
            return ModelObject(id=model, created=0)
        raise not_found(f"The model `{model}` does not exist")

    async def ready(request: Request) -> JSONResponse:
        """This API process can take requests: Redis answers. Which models have a live worker is detail (a model
        without one answers 503 with Retry-After; `/v2/models/{name}/ready` is its own probe)."""
        try:
            models = await request.app.state.registry.ready()
        except UNAVAILABLE:
            return JSONResponse({"ready": False, "redis": False, "models": {}}, status_code=503,
                                headers={"Retry-After": RETRY_AFTER[503]})
        return JSONResponse({"ready": True, "redis": True, "models": models})

    # The bare probes, and the same readiness under each API prefix: tools given the OpenAI base URL
    # (`.../v3`, `.../v1`) look for `{base}/health` (guidellm does).
    for path in ("/health", "/v2/health/ready", "/v3/health", "/v1/health"):
        app.add_api_route(path, ready, methods=["GET"])

    hot: dict[str, Endpoint] = {}
    for prefix in ("/v3", "/v1"):
        for path, endpoint in (("chat/completions", chat), ("completions", completions), ("responses", responses),
                               ("responses/compact", compact),
                               ("images/generations", image_generations), ("images/edits", image_edits),
                               ("audio/transcriptions", transcriptions), ("audio/translations", translations),
                               ("audio/speech", speech), ("embeddings", embeddings), ("rerank", rerank),
                               ("videos", create_video)):
            app.add_api_route(f"{prefix}/{path}", endpoint, methods=["POST"])
            hot[f"{prefix}/{path}"] = endpoint
        app.add_api_route(f"{prefix}/models", list_models, methods=["GET"])
        app.add_api_route(f"{prefix}/models/{{model:path}}", get_model, methods=["GET"])
        app.include_router(stored_responses.router, prefix=prefix)
        app.include_router(conversations.router, prefix=prefix)
        app.include_router(files.router, prefix=prefix)
        app.include_router(batches.router, prefix=prefix)
        app.include_router(tokenize.router, prefix=prefix)
        app.include_router(videos.router, prefix=prefix)
        app.add_api_route(f"{prefix}/videos/{{video_id}}/remix", remix_video, methods=["POST"])
        app.include_router(config_routes.router, prefix=prefix)
        app.include_router(lora.router, prefix=prefix)

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/models/{model:path}/ready")
    async def model_ready(request: Request, model: str) -> JSONResponse:
        served = await request.app.state.registry.served(model)
        if served is None:
            raise not_found(f"The model `{model}` does not exist")
        if not served:
            return error_response(503, unavailable(f"The model `{model}` is not being served by any worker right "
                                                   "now").body, {"Retry-After": RETRY_AFTER[503]})
        return JSONResponse({"model": model, "ready": True})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        registry = request.app.state.registry
        models = {name: list(await registry.cards(name)) for name in await registry.models()}
        await request.app.state.metrics.read_webhooks()
        body = await request.app.state.metrics.render(models) + await batches.batch_metrics(request)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return hot


async def _counted(request: Request, endpoint: str, handler: Any) -> Response:
    """Run a generation endpoint with its `Record`: finished here, or by its stream when it streams."""
    metrics = request.app.state.metrics
    record = request.state.record = Record(endpoint)
    if tracing.active():
        record.trace = RequestTrace(request, endpoint)
    try:
        response = await handler(request)
    except ClientGone:  # before any answer: nobody reads this one, but logs and metrics do
        record.failed(CLIENT_CLOSED)
        response = Response(status_code=CLIENT_CLOSED)
    except OvqError as exc:
        record.failed(exc.status, exc.body.code)
        metrics.finish(record)
        raise
    except BaseException:
        record.failed(500)
        metrics.finish(record)
        raise
    if not record.streaming:
        record.status = response.status_code
        if response.status_code >= 400 and not record.outcome:
            record.failed(response.status_code)
        metrics.finish(record)
    return response


def _model_object(name: str, card: Any) -> ModelObject:
    return ModelObject(id=name, created=card.created if card else 0)
