"""A worker's own Prometheus metrics: read from its state at scrape time, so they vanish with the worker."""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from workers.base import BaseWorker

LABELS = ["model", "device"]


class WorkerCollector(Collector):
    def __init__(self, worker: BaseWorker) -> None:
        self.worker = worker

    def collect(self):  # type: ignore[no-untyped-def]
        w = self.worker
        labels = [w.model.name, w.device]
        stats = w.engine_stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value)
            return family

        yield gauge("ovq_worker_running_jobs", "Jobs this worker is running", len(w.running))
        yield gauge("ovq_worker_capacity_jobs", "Jobs this worker can run at once (max_num_seqs, or 1)", w.capacity)
        yield gauge("ovq_worker_draining", "1 while the worker drains (takes no new jobs)", int(w.draining))
        if stats is not None:
            requests, scheduled, cache, prefill = stats
            yield gauge("ovq_worker_kv_cache_usage_ratio", "KV cache in use (GenAI PipelineMetrics)", cache / 100)
            yield gauge("ovq_worker_scheduled_sequences", "Requests the engine scheduled in its last step", scheduled)
            yield gauge("ovq_worker_waiting_sequences", "Requests in the engine it could not schedule",
                        max(0, requests - scheduled))
            yield gauge("ovq_worker_prefill_waiting_tokens", "Prompt tokens waiting for prefill", prefill)
        yield counter("ovq_worker_jobs_taken", "Jobs taken from the stream", w.jobs_taken)
        yield counter("ovq_worker_reclaimed_jobs", "Jobs of dead workers taken over", w.reclaimer.reclaimed)
        yield counter("ovq_worker_generated_tokens", "Tokens generated", w.tokens_generated)
        yield counter("ovq_worker_engine_restarts", "Engine processes restarted after a failure", w.engine_restarts)


def render(worker: BaseWorker) -> bytes:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    return generate_latest(registry)
