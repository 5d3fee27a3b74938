"""Prometheus for the API tier, and its access log.

Each request leaves one `Record` (model, device, outcome, tokens, timings) when it ends: for a stream that is
when the stream ends, so a stream that fails mid-way counts as that failure, not as its 200. Queue depth per
model and device is read from Redis on scrape (every API process exports the same values: aggregate them with
`max`, never `sum`); series of models no longer announced are dropped at scrape.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from redis.exceptions import ResponseError

from api.ops.refusals import Refusals
from api.ops.tracing import RequestTrace
from common import fairness
from common.events import DoneEvent
from common.jobs import LEVELS
from common.keys import GROUP, Keys
from common.ops.cluster import affinity_waiting
from common.ops.stats import BOUNDS

LABELS = ("model", "device")
TOP_TENANTS = 10  # tenants shown per model and device in ovq_queue_waiting_jobs_by_tenant
access_log = logging.getLogger("ovq.access")

# The ops page's bounds (common/ops/stats.py BOUNDS), in seconds: the same latency reads alike on both.
LATENCY = tuple(ms / 1000 for ms in BOUNDS["ttft"])
TOKEN_LATENCY = tuple(ms / 1000 for ms in BOUNDS["itl"])
DURATION = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


def outcome_of(status: int, code: str | int | None = None) -> str:
    """The kind of a request that ended in an error status."""
    if status == 499:
        return "cancelled"
    if status == 429:
        return "rate_limited"
    if status == 503:
        return "unavailable"
    if status == 504:
        return "timeout"
    if status < 500:
        return "rejected"
    return "worker_died" if code == "worker_died" else "engine_error"


@dataclass
class Record:
    """What one request did."""

    endpoint: str
    request_id: str = ""
    method: str = "POST"
    started: float = field(default_factory=time.monotonic)
    model: str = ""
    device: str = ""
    status: int = 200
    outcome: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_ms: float | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None  # the request's mean inter-token latency
    streaming: bool = False  # ended by its stream, not by the handler's return
    trace: RequestTrace | None = None  # when tracing is on (common/tracing.py)

    def failed(self, status: int, code: str | int | None = None) -> None:
        self.status, self.outcome = status, outcome_of(status, code)

    def done(self, event: DoneEvent) -> None:
        """A job's `done` event: its usage and the worker's timings (several jobs add up)."""
        usage, timings = event.get("usage") or {}, event.get("timings") or {}
        completion = usage.get("completion_tokens", 0)
        self.prompt_tokens += usage.get("prompt_tokens", 0)
        self.completion_tokens += completion
        self.queue_ms = timings.get("queue_ms")
        ttft = timings.get("ttft_ms")
        if ttft is not None:
            self.ttft_ms = ttft
            if completion > 1:
                self.itl_ms = (timings["total_ms"] - ttft) / (completion - 1)


class Series(NamedTuple):
    """One (model, device)'s children of the per-model metrics."""

    prompt_tokens: Any
    generation_tokens: Any
    duration: Any
    queue_time: Any
    ttft: Any
    itl: Any


class Metrics:
    def __init__(self, redis: aioredis.Redis, keys: Keys, worker_ttl_s: float, log_access: bool = False,
                 refusals: Refusals | None = None, job_ttl_s: float = 3600.0) -> None:
        self.fleet_refusals = refusals  # the fleet's count, in Redis (the ops page's)
        self.redis, self.keys, self.worker_ttl_s, self.log_access = redis, keys, worker_ttl_s, log_access
        self.job_ttl_s = job_ttl_s  # how long a dead worker's affinity stream may still hold jobs
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ovq_requests", "HTTP requests answered, by the status their headers carried",
                                ("endpoint", "status"), registry=r)
        self.outcomes = Counter("ovq_request_outcomes", "Requests by how they ended: a finish reason, or a failure "
                                "kind (rejected, rate_limited, unavailable, timeout, worker_died, engine_error, "
                                "cancelled)", (*LABELS, "outcome"), registry=r)
        self.prompt_tokens = Counter("ovq_prompt_tokens", "Prompt tokens of finished requests", LABELS, registry=r)
        self.generation_tokens = Counter("ovq_generation_tokens", "Tokens generated for finished requests", LABELS,
                                         registry=r)
        self.ttft = Histogram("ovq_time_to_first_token_seconds", "From enqueue to the first token", LABELS,
                              registry=r, buckets=LATENCY)
        self.itl = Histogram("ovq_inter_token_latency_seconds", "Mean time between tokens, one sample per request",
                             LABELS, registry=r, buckets=TOKEN_LATENCY)
        self.duration = Histogram("ovq_request_duration_seconds", "From the request's arrival to its last byte",
                                  LABELS, registry=r, buckets=DURATION)
        self.queue_time = Histogram("ovq_queue_time_seconds", "From enqueue to a worker taking the job", LABELS,
                                    registry=r, buckets=LATENCY)
        self.waiting = Gauge("ovq_queue_waiting_jobs", "Interactive jobs waiting (XLEN - pending) in the stream and "
                             "in the workers' affinity streams", LABELS, registry=r)
        self.waiting_by_priority = Gauge("ovq_queue_waiting_jobs_by_priority", "Jobs waiting in each priority "
                                         "level's stream (XLEN - pending); interactive's with the workers' affinity "
                                         "streams", (*LABELS, "priority"), registry=r)
        self.waiting_affinity = Gauge("ovq_queue_waiting_jobs_affinity", "Of the interactive jobs waiting, those in "
                                      "the workers' affinity streams (prefix affinity)", LABELS, registry=r)
        self.waiting_by_tenant = Gauge("ovq_queue_waiting_jobs_by_tenant", f"Jobs waiting per tenant (fair shares), "
                                       f"the {TOP_TENANTS} with the most per model and device", (*LABELS, "tenant"),
                                       registry=r)
        self.in_flight = Gauge("ovq_queue_in_flight_jobs", "Jobs delivered to a worker, not yet acked", LABELS,
                               registry=r)
        self.workers = Gauge("ovq_live_workers", "Workers with a fresh heartbeat", LABELS, registry=r)
        self.refusals = Counter("ovq_refusals", "Requests refused before a worker saw them, by reason: deadline "
                                "(the queue's wait estimate passes it), quota (the tenant's token rate), queue_full",
                                ("model", "reason"), registry=r)
        self.alias_requests = Counter("ovq_alias_requests", "Requests that named an alias of the models file, by the "
                                      "target its weights sent them to (their other metrics are the target's)",
                                      ("alias", "target"), registry=r)
        self.webhooks = Counter("ovq_webhook_deliveries", "Webhook delivery attempts this process made, by outcome: "
                                "delivered (2xx), failed (retried later), gave_up (past OVQ_WEBHOOK_RETRY_FOR_S), "
                                "refused (an address webhooks may not go to)", ("outcome",), registry=r)
        self.webhooks_waiting = Gauge("ovq_webhooks_waiting", "Webhook events and deliveries in Redis: `stream` "
                                      "(new, or being delivered), `retry` (waiting for their next attempt); the same "
                                      "on every process", ("state",), registry=r)
        self._labelled = (self.outcomes, self.prompt_tokens, self.generation_tokens, self.ttft, self.itl,
                          self.duration, self.queue_time, self.waiting, self.in_flight, self.workers,
                          self.waiting_by_priority, self.waiting_by_tenant, self.waiting_affinity)
        # Each (model, device)'s series, looked up once: `labels()` costs more than the update it leads to.
        self._series: dict[tuple[str, str], Series] = {}
        self._requests: dict[tuple[str, int], Any] = {}  # `requests` by (endpoint, status): never retired

    def _of(self, model: str, device: str) -> Series:
        series = self._series.get((model, device))
        if series is None:
            series = self._series[model, device] = Series(
                *(metric.labels(model, device) for metric in (self.prompt_tokens, self.generation_tokens,
                                                              self.duration, self.queue_time, self.ttft, self.itl)))
        return series

    def finish(self, record: Record) -> None:
        if record.trace is not None:
            record.trace.end(record.status, record.outcome or "stop", {
                "ovq.request_id": record.request_id, "gen_ai.request.model": record.model, "ovq.device": record.device,
                "gen_ai.usage.input_tokens": record.prompt_tokens,
                "gen_ai.usage.output_tokens": record.completion_tokens, "ovq.streaming": record.streaming})
        counted = self._requests.get((record.endpoint, record.status))
        if counted is None:
            counted = self._requests[record.endpoint, record.status] = self.requests.labels(record.endpoint,
                                                                                            str(record.status))
        counted.inc()
        if record.model:
            self.outcomes.labels(record.model, record.device, record.outcome or "stop").inc()
            series = self._of(record.model, record.device)
            series.prompt_tokens.inc(record.prompt_tokens)
            series.generation_tokens.inc(record.completion_tokens)
            series.duration.observe(time.monotonic() - record.started)
            if record.queue_ms is not None:
                series.queue_time.observe(record.queue_ms / 1000)
            if record.ttft_ms is not None:
                series.ttft.observe(record.ttft_ms / 1000)
            if record.itl_ms is not None:
                series.itl.observe(record.itl_ms / 1000)
        if self.log_access:
            access_log.info(orjson.dumps({
                "request_id": record.request_id, "method": record.method, "endpoint": record.endpoint,
                "status": record.status, "outcome": record.outcome, "model": record.model, "device": record.device,
                "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
                "queue_ms": record.queue_ms, "ttft_ms": record.ttft_ms,
                "total_ms": round((time.monotonic() - record.started) * 1000, 1)}).decode())

    def aliased(self, alias: str, target: str) -> None:
        self.alias_requests.labels(alias, target).inc()
    def webhook_counted(self, outcome: str) -> None:
        self.webhooks.labels(outcome).inc()

    def refused(self, model: str, reason: str, device: str = "") -> None:
        """`device`: the model's first device, whose stats windows count the fleet's refusals."""
        self.refusals.labels(model, reason).inc()
        if self.fleet_refusals is not None and device:
            self.fleet_refusals.count(model, device, reason)

    async def queue_depth(self, model: str, device: str) -> tuple[int, int, int]:
        """(waiting, in flight, live workers). Redis 6.2 has no group `lag`: waiting = XLEN - pending."""
        stream = self.keys.jobs(model, device)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xpending(stream, GROUP)
        pipe.zcount(self.keys.workers(model, device), time.time() - self.worker_ttl_s, "+inf")
        try:
            length, pending, live = await pipe.execute()
        except ResponseError:  # no stream or group yet
            return 0, 0, 0
        in_flight = fairness.in_flight(pending)
        return max(int(length) - in_flight, 0), in_flight, int(live)

    async def waiting_levels(self, model: str, device: str) -> dict[str, int]:
        """Jobs waiting per priority level (`common.jobs.LEVELS`), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for level in LEVELS:
            stream = self.keys.level_jobs(model, device, level)
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
        replies = await pipe.execute(raise_on_error=False)
        waiting = {}
        for i, level in enumerate(LEVELS):
            length, pending = replies[2 * i], replies[2 * i + 1]
            ok = isinstance(length, int) and isinstance(pending, dict)
            waiting[level] = max(length - fairness.in_flight(pending), 0) if ok else 0
        return waiting

    async def waiting_tenants(self, model: str, device: str) -> dict[str, int]:
        """Parked jobs per tenant over the fair levels (common/fairness.py), the TOP_TENANTS with the most."""
        pipe = self.redis.pipeline(transaction=False)
        for level in LEVELS:  # (batch lines are parked when they run as their batch's owner's)
            pipe.hgetall(self.keys.fair_clock(model, device, level))
        counts: dict[str, int] = {}
        for clock in await pipe.execute(raise_on_error=False):
            if isinstance(clock, dict):
                for tenant, n in fairness.tenant_counts(clock).items():
                    counts[tenant] = counts.get(tenant, 0) + n
        return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:TOP_TENANTS])

    async def render(self, models: dict[str, list[str]]) -> bytes:
        served = {(model, device) for model, devices in models.items() for device in devices}
        for metric in self._labelled:  # a retired model's series go with it
            for labels in list(metric._metrics):  # noqa: SLF001 - prometheus_client has no public listing
                if tuple(labels[:2]) not in served:
                    metric.remove(*labels)
                    self._series.pop(tuple(labels[:2]), None)  # a later request makes fresh ones
        pairs = sorted(served)
        affine = dict(zip(pairs, await affinity_waiting(self.redis, self.keys, self.job_ttl_s, pairs), strict=True)) \
            if pairs else {}
        for model, device in pairs:
            waiting, in_flight, live = await self.queue_depth(model, device)
            self.waiting.labels(model, device).set(waiting + affine[model, device])
            self.waiting_affinity.labels(model, device).set(affine[model, device])
            self.in_flight.labels(model, device).set(in_flight)
            self.workers.labels(model, device).set(live)
            for level, n in (await self.waiting_levels(model, device)).items():
                extra = affine[model, device] if level == "interactive" else 0
                self.waiting_by_priority.labels(model, device, level).set(n + extra)
            tenants = await self.waiting_tenants(model, device)
            for labels in list(self.waiting_by_tenant._metrics):  # noqa: SLF001 - tenants that no longer wait go
                if tuple(labels[:2]) == (model, device) and labels[2] not in tenants:
                    self.waiting_by_tenant.remove(*labels)
            for tenant, n in tenants.items():
                self.waiting_by_tenant.labels(model, device, tenant).set(n)
        return generate_latest(self.registry)

    async def read_webhooks(self) -> None:
        """The webhook gauges, from Redis (before `render`)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(self.keys.webhooks)
        pipe.zcard(self.keys.webhook_retries)
        stream, retry = await pipe.execute()
        self.webhooks_waiting.labels("stream").set(stream)
        self.webhooks_waiting.labels("retry").set(retry)
