"""A worker's own port: liveness, readiness (engine up, Redis answering, not draining) and its metrics."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from subprocess import Popen

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import MODELS, Tiers, free_port

TINY, PORTLESS = "tiny-llama", "tiny-portless"  # the same weights under two names: one worker each


@dataclass
class Probed:
    tiers: Tiers
    port: int  # the probes port of TINY's worker
    with_port: Popen[bytes]  # TINY's worker
    portless: Popen[bytes]  # PORTLESS's worker, started without one


@pytest.fixture(scope="module")
def probed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    t = Tiers(redis_url, tmp_path_factory.mktemp("probes"),
              {TINY: {"path": str(MODELS / TINY), "cache_size": 0, "max_num_seqs": 8},
               PORTLESS: {"path": str(MODELS / TINY), "cache_size": 0}})
    t.api()
    port = free_port()
    with_port = t.worker(TINY, name="probed", OVQ_WORKER_PORT=str(port), OVQ_WORKER_HOST="127.0.0.1")
    portless = t.worker(PORTLESS, name="portless")
    t.wait_served(TINY, PORTLESS)
    yield Probed(t, port, with_port, portless)
    t.stop()


def test_a_worker_answers_probes_and_exports_its_metrics(probed: Probed) -> None:
    t, base = probed.tiers, f"http://127.0.0.1:{probed.port}"
    assert httpx.get(f"{base}/live").status_code == 200
    ready = httpx.get(f"{base}/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True, "reason": "ready"}
    httpx.post(f"{t.base_url}/completions", json={"model": TINY, "prompt": "a b c", "max_tokens": 5,
                                                  "ignore_eos": True}, timeout=60).raise_for_status()
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)}
    samples = {f.name: f.samples[0] for f in families.values()}
    assert samples["ovq_worker_capacity_jobs"].value == 8
    assert samples["ovq_worker_capacity_jobs"].labels == {"model": TINY, "device": "CPU"}
    assert samples["ovq_worker_jobs_taken"].value == 1 and samples["ovq_worker_generated_tokens"].value == 5
    assert "ovq_worker_kv_cache_usage_ratio" in samples
    assert httpx.get(f"{base}/nothing").status_code == 404


def test_a_worker_without_a_port_opens_none(probed: Probed) -> None:
    assert "probes and metrics" not in probed.tiers.log(probed.portless)
    assert "probes and metrics" in probed.tiers.log(probed.with_port)  # the line it looks for is the right one
