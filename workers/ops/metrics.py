"""A worker's own Prometheus metrics: read from its state at scrape time, so they vanish with the worker."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from workers.vitals import Member, Vitals

LABELS = ["model", "device"]


class WorkerCollector(Collector):
    def __init__(self, member: Member, vitals: Vitals) -> None:
        self.member, self.vitals = member, vitals

    def collect(self):  # type: ignore[no-untyped-def]
        v = self.vitals
        labels = [self.member.model, self.member.device]
        stats = v.engine

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value)
            return family

        yield gauge("ovq_worker_running_jobs", "Jobs this worker is running", v.running)
        yield gauge("ovq_worker_capacity_jobs", "Jobs this worker can run at once (max_num_seqs, or 1)", v.capacity)
        yield gauge("ovq_worker_draining", "1 while the worker drains (takes no new jobs)", int(v.draining))
        if v.admission_knee:
            yield gauge("ovq_worker_admission_knee_sequences",
                        "The knee of the worker's learned tokens/s against running sequences", v.admission_knee)
            yield gauge("ovq_worker_admission_limit_sequences",
                        "Sequences the worker admits to now: the knee within the model's target_itl_ms",
                        v.admission_limit)
        if stats is not None:
            requests, scheduled, cache, prefill = stats
            yield gauge("ovq_worker_kv_cache_usage_ratio", "KV cache in use (GenAI PipelineMetrics)", cache / 100)
            yield gauge("ovq_worker_scheduled_sequences", "Requests the engine scheduled in its last step", scheduled)
            yield gauge("ovq_worker_waiting_sequences", "Requests in the engine it could not schedule",
                        max(0, requests - scheduled))
            yield gauge("ovq_worker_prefill_waiting_tokens", "Prompt tokens waiting for prefill", prefill)
        yield counter("ovq_worker_jobs_taken", "Jobs taken from the stream", v.jobs_taken)
        yield counter("ovq_worker_reclaimed_jobs", "Jobs of dead workers taken over", v.reclaimed)
        yield counter("ovq_worker_affinity_hits", "Jobs run from its own affinity stream (prefix affinity)",
                      v.affinity_hits)
        yield counter("ovq_worker_affinity_steals", "Jobs taken from another worker's affinity stream",
                      v.affinity_steals)
        yield counter("ovq_worker_generated_tokens", "Tokens generated", v.tokens_generated)
        yield counter("ovq_worker_engine_restarts", "Engine processes restarted after a failure", v.engine_restarts)


def render(member: Member, vitals: Vitals) -> bytes:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(member, vitals))
    return generate_latest(registry)
