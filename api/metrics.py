"""Prometheus: this API process's own counters, and queue depth per model and device read from Redis on scrape."""
from __future__ import annotations

import time

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from redis.exceptions import ResponseError

from common.events import Done
from common.keys import GROUP, Keys

LABELS = ("model", "device")


class Metrics:
    def __init__(self, redis: aioredis.Redis, keys: Keys, worker_ttl_s: float) -> None:
        self.redis, self.keys, self.worker_ttl_s = redis, keys, worker_ttl_s
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ovq_requests", "HTTP requests answered", ("endpoint", "status"), registry=r)
        self.waiting = Gauge("ovq_queue_waiting_jobs", "Jobs waiting in the stream (consumer-group lag)", LABELS,
                             registry=r)
        self.in_flight = Gauge("ovq_queue_in_flight_jobs", "Jobs delivered to a worker, not yet acked", LABELS,
                               registry=r)
        self.workers = Gauge("ovq_live_workers", "Workers with a fresh heartbeat", LABELS, registry=r)
        self.tokens = Counter("ovq_generated_tokens", "Completion tokens generated", ("model",), registry=r)
        self.ttft = Histogram("ovq_time_to_first_token_seconds", "From enqueue to first token", ("model",),
                              registry=r, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.queue_time = Histogram("ovq_queue_seconds", "From enqueue to a worker taking the job", ("model",),
                                    registry=r, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30))

    def observe_done(self, model: str, event: Done) -> None:
        self.tokens.labels(model).inc(event.usage.completion_tokens)
        self.queue_time.labels(model).observe(event.timings.queue_ms / 1000)
        if event.timings.ttft_ms is not None:
            self.ttft.labels(model).observe(event.timings.ttft_ms / 1000)

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
        in_flight = int(pending["pending"])
        return max(int(length) - in_flight, 0), in_flight, int(live)

    async def render(self, models: dict[str, list[str]]) -> bytes:
        for model, devices in models.items():
            for device in devices:
                waiting, in_flight, live = await self.queue_depth(model, device)
                self.waiting.labels(model, device).set(waiting)
                self.in_flight.labels(model, device).set(in_flight)
                self.workers.labels(model, device).set(live)
        return generate_latest(self.registry)
