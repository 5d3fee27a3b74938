"""/v1/batches (and /v3/batches): create, retrieve, list and cancel batches; the work is done by batch workers.

Creating a batch checks what the request says (endpoint, window, metadata, the input file's existence and
purpose), stores the batch as `validating` and queues it on rq; a batch worker validates the file's lines and
runs them (workers/batch/runner.py). Metrics about batches come from Redis, so every API process shows all of them.
"""
from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Query, Request
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from api.batch.files import file_store
from api.batch.protocol import Batch, BatchCreateRequest, BatchList
from api.http.auth import caller_of
from common.batch.rq_keys import RQPrefixError
from common.batch.store import (
    TERMINAL,
    Batches,
    BatchQueue,
    BatchState,
    ModelBatches,
    new_batch_id,
    new_run_token,
    per_model,
    window_seconds,
)
from common.errors import OvqError
from common.redis.client import connect_rq

router = APIRouter()
ENDPOINTS = ("/chat/completions", "/completions", "/embeddings", "/responses", "/videos")
METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 64, 512


def batches(request: Request) -> Batches:
    registry = request.app.state.registry
    return Batches(registry.redis, registry.keys, registry.settings)


def batch_queue(request: Request) -> BatchQueue:
    state = request.app.state
    if getattr(state, "batch_queue", None) is None:
        registry = state.registry
        try:
            state.batch_queue = BatchQueue(connect_rq(registry.settings), registry.keys, registry.settings)
        except (ValueError, RQPrefixError) as exc:  # a deployment's settings, not the request: said, not a crash
            raise OvqError(f"The Batch API cannot run here: {exc}", 500, "server_error") from exc
    return state.batch_queue


def endpoint_path(endpoint: str) -> str | None:
    """`/v1/chat/completions` (or /v3/...) -> `/chat/completions`; None for an endpoint batches cannot use."""
    for version in ("/v1", "/v3"):
        if endpoint.startswith(version) and endpoint[len(version):] in ENDPOINTS:
            return endpoint[len(version):]
    return None


def check_metadata(metadata: dict[str, str] | None, most: int) -> None:
    if not metadata:
        return
    if len(metadata) > most:
        raise OvqError(f"metadata has {len(metadata)} pairs; at most {most} are allowed", param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
            raise OvqError(f"metadata keys are at most {METADATA_KEY_CHARS} characters and values at most "
                           f"{METADATA_VALUE_CHARS}", param="metadata")


def no_such_batch(batch_id: str) -> OvqError:
    return OvqError(f"No such Batch object: {batch_id}", 404, "invalid_request_error", param="batch_id")


@router.post("/batches")
async def create_batch(request: Request, body: BatchCreateRequest) -> Batch:
    settings = request.app.state.registry.settings
    if endpoint_path(body.endpoint) is None:
        raise OvqError(f"endpoint must be /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses or "
                       f"/v1/videos, not {body.endpoint!r}", param="endpoint")
    if body.completion_window not in settings.batch_completion_windows:
        raise OvqError(f"completion_window must be one of {', '.join(settings.batch_completion_windows)}",
                       param="completion_window")
    check_metadata(body.metadata, settings.batch_max_metadata)
    caller = caller_of(request)
    stored = await file_store(request).get(body.input_file_id, caller)
    if stored is None:
        raise OvqError(f"No such File object: {body.input_file_id}", param="input_file_id")
    if stored.purpose != "batch":
        raise OvqError(f"The file {body.input_file_id} has purpose {stored.purpose!r}; a batch needs purpose 'batch'",
                       param="input_file_id")
    now = int(time.time())
    state = BatchState(id=new_batch_id(), endpoint=body.endpoint, input_file_id=body.input_file_id,
                       completion_window=body.completion_window, created_at=now,
                       expires_at=now + window_seconds(body.completion_window), metadata=body.metadata,
                       output_ttl_s=body.output_expires_after.seconds if body.output_expires_after else None,
                       owner=caller.tenant, run_token=new_run_token())
    queue, store = batch_queue(request), batches(request)
    await store.create(state)
    # A batch created but not queued (Redis went away just now) is queued by a batch worker's sweep.
    state.rq_job = await asyncio.to_thread(queue.enqueue, state.id)
    await store.set_rq_job(state.id, state.rq_job)
    return Batch.of(state)


@router.get("/batches")
async def list_batches(request: Request, after: str | None = None,
                       limit: int = Query(20, ge=1, le=100)) -> BatchList:
    found, more = await batches(request).page(after, limit, caller_of(request))
    data = [Batch.of(s) for s in found]
    return BatchList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                     has_more=more)


@router.get("/batches/{batch_id}")
async def retrieve_batch(request: Request, batch_id: str) -> Batch:
    state = await batches(request).get(batch_id, caller_of(request))
    if state is None:
        raise no_such_batch(batch_id)
    return Batch.of(state)


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> Batch:
    """Stop feeding its lines: those in flight finish, the batch ends `cancelled` with what was done."""
    store, caller = batches(request), caller_of(request)
    status = await store.cancel(batch_id, caller)
    if not status:
        raise no_such_batch(batch_id)
    if status == "finalizing" or (status in TERMINAL and status != "cancelled"):
        raise OvqError(f"Cannot cancel a batch with status {status!r}", 409, param="batch_id")
    state = await store.get(batch_id, caller)
    if state is None:
        raise no_such_batch(batch_id)
    return Batch.of(state)


def batch_families(entries: list[ModelBatches]) -> list[Metric]:
    """The batch metric families for these per-model summaries (also what docs/gen_reference.py lists)."""
    lines = CounterMetricFamily("ovq_batch_lines", "Batch lines answered, by outcome (completed: 2xx)",
                                labels=["model", "outcome"])
    in_flight = GaugeMetricFamily("ovq_batch_lines_in_flight", "Batch lines sent and not yet answered",
                                  labels=["model"])
    running = GaugeMetricFamily("ovq_batches", "Batches not yet ended, by status", labels=["model", "status"])
    for entry in entries:
        lines.add_metric([entry.model, "completed"], entry.completed)
        lines.add_metric([entry.model, "failed"], entry.failed)
        if entry.batches:
            in_flight.add_metric([entry.model], entry.in_flight)
        for status, count in entry.batches.items():
            running.add_metric([entry.model, status], count)
    return [lines, in_flight, running]


async def batch_metrics(request: Request) -> bytes:
    """Prometheus text for batches: lines done and failed per model (counters kept in Redis, so every API process
    reports the same), lines in flight and batches running per model."""
    registry = request.app.state.registry
    families = batch_families(await per_model(registry.redis, registry.keys))

    class Snapshot:
        def collect(self):  # noqa: ANN202 - prometheus_client's collector protocol
            return families

    out = CollectorRegistry()
    out.register(Snapshot())
    return generate_latest(out)
