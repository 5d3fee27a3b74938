"""A killed embeddings worker, as a killed text worker: what it was running (no embeddings job streams anything) is
run again by the model's next live worker, and every request gets its whole answer; none hangs."""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import redis

from common.jobs import JobHash, JobStatus
from tests.conftest import MODELS, Tiers

EMBED = "tiny-embed"


def holders(r: redis.Redis, t: Tiers, job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Each job's (status, worker) from its hash; worker ids are host-pid-suffix."""
    got = {}
    for job_id in job_ids:
        status, worker = r.hmget(t.keys.job(job_id, EMBED), [JobHash.STATUS, JobHash.WORKER])
        got[job_id] = ((status or b"").decode(), (worker or b"").decode())
    return got


def test_a_killed_workers_requests_are_run_again_by_the_next_worker(tiers: Callable[..., Tiers]) -> None:
    # A budget of 1 puts each big request in a pipeline call of its own: the first worker holds all of them.
    t = tiers({EMBED: {"path": str(MODELS / EMBED)}}, OVQ_EMBED_BATCH_TOKENS="1")
    t.api()
    first = t.worker(EMBED, name="first")
    t.wait_served(EMBED)
    r = t.redis()
    # Enough work (8 x 2000 texts of about 40 tokens) that the kill comes while most of it is still running.
    texts = [f"the quick brown fox number {i} jumps over the lazy dog " * 4 for i in range(2000)]
    run = time.time_ns()
    ids = [f"embed-recovery-{run}-{i}" for i in range(8)]

    def ask(inputs: list[str], job_id: str | None = None) -> httpx.Response:
        return httpx.post(f"{t.base_url}/embeddings", json={"model": EMBED, "input": inputs}, timeout=300,
                          headers={"X-Request-Id": job_id} if job_id else None)

    def first_runs_one() -> bool:
        return any(status == JobStatus.RUNNING and f"-{first.pid}-" in worker
                   for status, worker in holders(r, t, ids).values())

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, texts, job_id) for job_id in ids]
        deadline = time.monotonic() + 120
        while not any(f.done() for f in futures) and not first_runs_one() and time.monotonic() < deadline:
            time.sleep(0.02)  # until its job hashes say it runs them
        psutil.Process(first.pid).kill()
        first.wait(10)
        t.procs.remove(first)  # killed on purpose: not a start-up failure for wait_served
        # What the dead worker held: accepted (`running`, its id in the hash) and never ended.
        held = [job_id for job_id, (status, worker) in holders(r, t, ids).items()
                if status == JobStatus.RUNNING and f"-{first.pid}-" in worker]
        second = t.worker(EMBED, name="second")  # its reclaim pass takes over the dead worker's jobs
        replies = [f.result() for f in futures]
    assert held, f"the killed worker held none of the jobs: {holders(r, t, ids)}"
    ended = holders(r, t, held)
    assert all(status == JobStatus.DONE and f"-{second.pid}-" in worker for status, worker in ended.values()), \
        (f"jobs of the killed worker not run to the end by the second: {ended}", [r.text[:200] for r in replies])
    assert "re-running" in t.log(second), t.log(second)[-2000:]
    print(f"the killed worker held {len(held)} of the 8 jobs; the second ran them again")
    assert [r.status_code for r in replies] == [200] * 8, [r.text[:200] for r in replies]
    assert all(len(r.json()["data"]) == len(texts) for r in replies)
    after = ask(texts[:3])
    assert after.status_code == 200 and len(after.json()["data"]) == 3
    assert second.poll() is None
