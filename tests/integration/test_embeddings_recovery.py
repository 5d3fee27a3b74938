"""A killed embeddings worker, as a killed text worker: its running requests end at once with a clean 500
(`worker_died`), none hangs, and the model's other worker serves what comes next."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil

from tests.conftest import MODELS, Tiers

EMBED = "tiny-embed"


def test_a_killed_workers_requests_fail_cleanly_and_the_other_worker_serves(tiers: Callable[..., Tiers]) -> None:
    # A budget of 1 puts each big request in a pipeline call of its own: the first worker holds all of them.
    t = tiers({EMBED: {"path": str(MODELS / EMBED)}}, OVQ_EMBED_BATCH_TOKENS="1")
    t.api()
    first = t.worker(EMBED, name="first")
    t.wait_served(EMBED)
    # Enough work (8 x 2000 texts of about 40 tokens) that the kill comes while most of it is still running.
    texts = [f"the quick brown fox number {i} jumps over the lazy dog " * 4 for i in range(2000)]

    def ask(inputs: list[str]) -> httpx.Response:
        return httpx.post(f"{t.base_url}/embeddings", json={"model": EMBED, "input": inputs}, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, texts) for _ in range(8)]
        while not any(f.done() for f in futures) and psutil.Process(first.pid).cpu_percent(0.5) < 10:
            pass  # until it is busy with them
        psutil.Process(first.pid).kill()
        replies = [f.result() for f in futures]
    codes = [r.status_code for r in replies]
    assert set(codes) <= {200, 500} and 500 in codes, codes
    assert all(r.json()["error"]["code"] == "worker_died" for r in replies if r.status_code == 500)
    assert all(len(r.json()["data"]) == len(texts) for r in replies if r.status_code == 200)
    first.wait(10)
    t.procs.remove(first)  # killed on purpose: not a start-up failure for wait_served
    second = t.worker(EMBED, name="second")
    t.wait_served(EMBED)
    after = ask(texts[:3])
    assert after.status_code == 200 and len(after.json()["data"]) == 3
    assert second.poll() is None
