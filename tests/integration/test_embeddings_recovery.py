"""A killed embeddings worker, as a killed text worker: what it was running (no embeddings job streams anything) is
run again by the model's next live worker, and every request gets its whole answer; none hangs."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil

from tests.conftest import MODELS, Tiers

EMBED = "tiny-embed"


def test_a_killed_workers_requests_are_run_again_by_the_next_worker(tiers: Callable[..., Tiers]) -> None:
    # A budget of 1 puts each big request in a pipeline call of its own: the first worker holds all of them.
    t = tiers({EMBED: {"path": str(MODELS / EMBED)}}, OVQ_EMBED_BATCH_TOKENS="1")
    t.api()
    first = t.worker(EMBED, name="first")
    t.wait_served(EMBED)
    # Enough work (8 x 2000 texts of about 40 tokens) that the kill comes while most of it is still running.
    texts = [f"the quick brown fox number {i} jumps over the lazy dog " * 4 for i in range(2000)]

    def ask(inputs: list[str]) -> httpx.Response:
        return httpx.post(f"{t.base_url}/embeddings", json={"model": EMBED, "input": inputs}, timeout=300)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, texts) for _ in range(8)]
        while not any(f.done() for f in futures) and psutil.Process(first.pid).cpu_percent(0.5) < 10:
            pass  # until it is busy with them
        psutil.Process(first.pid).kill()
        first.wait(10)
        t.procs.remove(first)  # killed on purpose: not a start-up failure for wait_served
        second = t.worker(EMBED, name="second")  # its reclaim pass takes over the dead worker's jobs
        replies = [f.result() for f in futures]
    assert [r.status_code for r in replies] == [200] * 8, [r.text[:200] for r in replies]
    assert all(len(r.json()["data"]) == len(texts) for r in replies)
    after = ask(texts[:3])
    assert after.status_code == 200 and len(after.json()["data"]) == 3
    assert second.poll() is None
