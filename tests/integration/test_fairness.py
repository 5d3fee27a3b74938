"""Fair shares per tenant: a tenant's jobs sent while another tenant's flood waits are taken next, not behind the
flood; the wait per tenant shows in /metrics; a key over its token-rate quota is refused (429, Retry-After).

One worker that runs one sequence at a time: the order it takes jobs in is observable (each job hash's `taken`).
A long stream of the flooding tenant holds the worker while the flood and the victims queue, and is dropped (its
job cancelled) once they all wait: the test then waits for no generation it does not need."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from common.keys import Keys
from tests.conftest import MODEL, Tiers

FLOOD, VICTIM, METERED, ADMIN = "sk-flood", "sk-victim", "sk-metered", "sk-admin"
FLOODED = 8


@pytest.fixture(scope="module")
def single(redis_url: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    work = tmp_path_factory.mktemp("fair")
    (work / "keys.yaml").write_text(f"keys:\n  - {{key: {FLOOD}, tenant: flood}}\n"
                                    f"  - {{key: {VICTIM}, tenant: victim}}\n"
                                    f"  - {{key: {METERED}, tenant: metered, tokens_per_min: 12}}\n")
    t = Tiers(redis_url, work, {MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 1}},
              OVQ_API_KEY_FILE=str(work / "keys.yaml"), OVQ_ADMIN_KEYS=ADMIN)
    t.api()
    t.worker(MODEL)
    t.wait_served(MODEL)
    yield t
    t.stop()


def _post(t: Tiers, rid: str, key: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{t.base_url}/completions", timeout=300,
                      headers={"Authorization": f"Bearer {key}", "X-Request-Id": rid},
                      json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens,
                            "ignore_eos": True})


def _hold(t: Tiers, running: threading.Event, drop: threading.Event) -> bool:
    """A long stream of the flooding tenant, read until `drop` is set; then dropped (its job cancelled). True: it
    was still running then."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{t.base_url}/completions", json=body, timeout=300,
                      headers={"Authorization": f"Bearer {FLOOD}", "X-Request-Id": "f-block"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                running.set()
            if drop.is_set():
                return line != "data: [DONE]"
    return False


def _until(check, what: str) -> None:  # noqa: ANN001
    until = time.monotonic() + 60
    while not check():
        assert time.monotonic() < until, what
        time.sleep(0.02)


def test_a_victim_tenant_is_served_next_not_behind_the_flood(single: Tiers) -> None:
    r = redis.Redis.from_url(single.redis_url)
    keys = Keys(single.prefix)
    job = lambda rid: r.hgetall(keys.job(rid))  # noqa: E731
    clock = keys.fair_clock(MODEL, "CPU", "interactive")
    running, drop = threading.Event(), threading.Event()
    with ThreadPoolExecutor(FLOODED + 3) as pool:
        held = pool.submit(_hold, single, running, drop)
        assert running.wait(60), "the long stream runs"
        futures = [pool.submit(_post, single, f"f-{n}", FLOOD) for n in range(FLOODED)]
        _until(lambda: r.xlen(keys.jobs(MODEL, "CPU")) == FLOODED + 1, "the flood is queued")
        admin = {"Authorization": f"Bearer {ADMIN}"}
        metrics = httpx.get(f"http://127.0.0.1:{single.port}/metrics", headers=admin)
        data = httpx.get(f"http://127.0.0.1:{single.port}/ops/data", headers=admin).json()
        panel = httpx.get(f"http://127.0.0.1:{single.port}/ops/panel", headers=admin).text
        for n in range(2):
            futures.append(pool.submit(_post, single, f"v-{n}", VICTIM))
            time.sleep(0.05)
        _until(lambda: r.hget(clock, "n:victim") == b"2", "the victims wait")
        drop.set()
        assert held.result(), "the long stream was dropped before its end"
    assert all(f.result().status_code == 200 for f in futures), [f.result().text for f in futures]
    assert f'ovq_queue_waiting_jobs_by_tenant{{device="CPU",model="{MODEL}",tenant="flood"}}' in metrics.text
    [stream] = [s for s in data["streams"] if s["model"] == MODEL]
    assert stream["tenants_waiting"]["flood"] >= FLOODED - 1 and stream["waiting"] >= FLOODED - 1, stream
    assert "waiting by tenant: flood" in panel
    flood = [float(job(f"f-{n}")[b"taken"]) for n in range(FLOODED)]
    for n in range(2):
        victim = job(f"v-{n}")
        created, taken = float(victim[b"created"]), float(victim[b"taken"])
        ahead = sum(created < t < taken for t in flood)
        assert ahead <= 1, f"v-{n} waited behind {ahead} flood jobs queued before it"
    assert all(t > float(job("v-1")[b"taken"]) for t in flood), "first come, first served"


def test_a_key_over_its_token_quota_is_refused_with_retry_after(single: Tiers) -> None:
    codes = []
    for n in range(3):  # 12 tokens a minute; each asks for 9 (5 of prompt): the second leaves the bucket at -6
        response = _post(single, f"q-{n}", METERED, max_tokens=4)
        codes.append(response.status_code)
    assert codes == [200, 200, 429], codes
    assert response.json()["error"]["code"] == "quota_exceeded"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    metrics = httpx.get(f"http://127.0.0.1:{single.port}/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    assert f'ovq_refusals_total{{model="{MODEL}",reason="quota"}} 1.0' in metrics.text
