"""/embeddings and /rerank: requests checked against the model's card here, the work done by an embeddings or
rerank worker (`workers/embed`), which batches the jobs that wait."""
from __future__ import annotations

import base64

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from api.openai.encoder_protocol import (
    EmbeddingRequest,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from api.openai.serving import parse_body
from api.ops.metrics import Record
from api.queue.client import ClientGone, JobClient, deadline, error_of, request_id
from api.queue.registry import Registry, Servable
from common.errors import OvqError
from common.events import CANCELLED, DONE, ERROR, DoneEvent
from common.jobs import EmbedParams, Job
from common.modelcard import EncoderLimits
from common.servable import ServableType
from common.settings import Settings


def check_embedding(body: EmbeddingRequest, limits: EncoderLimits, vocab_size: int | None) -> list[str | list[int]]:
    """The request's inputs, or a 400 naming what the model cannot take."""
    inputs = body.inputs()
    if len(inputs) > limits.max_inputs:
        raise OvqError(f"input has {len(inputs)} items; at most {limits.max_inputs} per request", param="input")
    if body.dimensions is not None and body.dimensions != limits.dimensions:
        if body.dimensions not in limits.allowed_dimensions:
            allowed = sorted({limits.dimensions, *limits.allowed_dimensions})
            raise OvqError(f"dimensions {body.dimensions} is not available for this model: it gives "
                           f"{', '.join(map(str, allowed))}", param="dimensions")
    for index, item in enumerate(inputs):
        if isinstance(item, list):
            if not limits.truncate and len(item) > limits.max_length:
                raise OvqError(f"input {index} has {len(item)} tokens, more than the model's {limits.max_length}",
                               param="input")
            if any(t < 0 or (vocab_size is not None and t >= vocab_size) for t in item):
                raise OvqError(f"input {index} holds a token id outside the model's vocabulary "
                               f"(0 to {(vocab_size or 1) - 1})", param="input")
    return inputs


def decode_vector(encoded: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype="<f4")


def embedding_body(vectors: list[str], model: str, tokens: int, floats: bool) -> bytes:
    """EmbeddingResponse's JSON written by orjson straight from the float32 arrays (through pydantic and Python
    floats it cost the API process more than the rest of the request)."""
    data = [{"object": "embedding", "index": i, "embedding": decode_vector(v) if floats else v}
            for i, v in enumerate(vectors)]
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, option=orjson.OPT_SERIALIZE_NUMPY)


def ranked(body: RerankRequest, scores: list[float]) -> list[RerankResult]:
    """Results by descending score (ties by document order), cut to top_n, with the documents when asked."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: body.top_n or len(scores)]
    results = []
    for index in order:
        document = None
        if body.return_documents:
            given = body.documents[index]
            document = {"text": given} if isinstance(given, str) else given.model_dump()
        results.append(RerankResult(index=index, relevance_score=scores[index], document=document))
    return results


class EncoderServing:
    def __init__(self, jobs: JobClient, registry: Registry, settings: Settings) -> None:
        self.jobs, self.registry, self.settings = jobs, registry, settings

    async def _servable(self, model: str, kind: ServableType, what: str) -> tuple[Servable, EncoderLimits]:
        servable = await self.registry.servable(model)
        limits = servable.card.encoder
        if servable.card.servable_type is not kind or limits is None:
            raise OvqError(f"The model `{model}` does not {what}", param="model")
        return servable, limits

    async def embeddings(self, request: Request) -> Response:
        body = await parse_body(request, EmbeddingRequest)
        servable, limits = await self._servable(body.model, ServableType.EMBEDDINGS, "compute embeddings")
        inputs = check_embedding(body, limits, servable.card.vocab_size)
        dimensions = body.dimensions if body.dimensions != limits.dimensions else None
        job = Job(id=request_id(request), model=body.model, device="", kind="embed", prompt="",
                  embed=EmbedParams(inputs=inputs, dimensions=dimensions), reply_to=self.jobs.hub.reply_to)
        done = await self._result(request, body.model, servable, job)
        tokens = (done.get("usage") or {}).get("prompt_tokens", 0)
        content = embedding_body(done.get("embeddings", []), body.model, tokens, body.encoding_format == "float")
        return self._json(content, request)

    async def rerank(self, request: Request) -> Response:
        body = await parse_body(request, RerankRequest)
        servable, limits = await self._servable(body.model, ServableType.RERANK, "rerank documents")
        if len(body.documents) > limits.max_inputs:
            raise OvqError(f"documents has {len(body.documents)} items; at most {limits.max_inputs} per request "
                           "(max_allowed_chunks)", param="documents")
        job = Job(id=request_id(request), model=body.model, device="", kind="rerank", prompt="",
                  embed=EmbedParams(inputs=list(body.texts()), query=body.query), reply_to=self.jobs.hub.reply_to)
        done = await self._result(request, body.model, servable, job)
        tokens = (done.get("usage") or {}).get("prompt_tokens", 0)
        answer = RerankResponse(id=job.id, results=ranked(body, done.get("scores", [])),
                                usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens))
        return self._json(answer.model_dump_json(exclude_none=True), request)

    @staticmethod
    def _json(content: str | bytes, request: Request) -> Response:
        return Response(content, media_type="application/json",
                        headers={"X-Request-Id": request.state.record.request_id})

    async def _result(self, request: Request, model: str, servable: Servable, job: Job) -> DoneEvent:
        """The job's `done` event; its error as the HTTP error; the client gone as ClientGone."""
        record: Record = request.state.record
        record.model = model
        ends = deadline(request, self.settings.request_timeout_s)
        async with self.jobs.open(request, [job], servable, ends) as generation:
            while not generation.finished:
                for event in await generation.events():
                    if event["type"] == DONE:
                        record.done(event)
                        return event  # type: ignore[return-value]
                    if event["type"] == ERROR:
                        raise error_of(event, "invalid_request_error")  # type: ignore[arg-type]
                    if event["type"] == CANCELLED:
                        raise ClientGone()
        raise ClientGone()
