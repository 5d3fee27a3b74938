"""The backlog stays in Redis until a worker can start it: workers share a burst, and one that joins during a
backlog takes waiting jobs at once (what makes autoscaling on the stream's length work)."""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
from openai import OpenAI

from common.keys import Keys
from tests.conftest import MODEL, Tiers


def _models(model_dir: Path, max_num_seqs: int = 64) -> dict[str, dict]:
    return {MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": max_num_seqs}}


def _burst(t: Tiers, n: int, max_tokens: int) -> list[str]:
    """n concurrent chats; the job id of each."""
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=300)

    def one(i: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write a story about the number {i}."}],
            max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
        assert reply.choices[0].finish_reason == "length"
        return reply.id.removeprefix("chatcmpl-")

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _ran_on(t: Tiers, jobs: list[str]) -> Counter[str]:
    r = redis.Redis.from_url(t.redis_url)
    keys = Keys(t.prefix)
    return Counter(r.hget(keys.job(job), "worker").decode() for job in jobs)


def test_two_workers_share_a_burst(tiers: Callable[..., Tiers], model_dir: Path) -> None:
    t = tiers(_models(model_dir))
    t.api()
    t.worker(MODEL, name="a")
    t.worker(MODEL, name="b")
    t.wait_served(MODEL, workers=2)
    jobs = _burst(t, 48, 24)
    shares = _ran_on(t, jobs)
    assert len(shares) == 2 and all(0.35 <= n / 48 <= 0.65 for n in shares.values()), shares


def test_a_worker_that_joins_during_a_backlog_takes_waiting_jobs(tiers: Callable[..., Tiers],
                                                                 model_dir: Path) -> None:
    # Four at a time and long answers: the backlog outlasts the second worker's start-up (seconds) by far.
    t = tiers(_models(model_dir, max_num_seqs=4))
    t.api()
    first = t.worker(MODEL, name="first")
    t.wait_served(MODEL)
    r = redis.Redis.from_url(t.redis_url)
    keys = Keys(t.prefix)
    stream = keys.jobs(MODEL, "CPU")
    result: list[list[str]] = []
    burst = threading.Thread(target=lambda: result.append(_burst(t, 48, 64)))
    burst.start()
    deadline = time.monotonic() + 60
    while r.xlen(stream) - r.xpending(stream, "workers")["pending"] < 16:  # a backlog has built up
        assert time.monotonic() < deadline and burst.is_alive()
        time.sleep(0.05)
    waiting_when_joined = r.xlen(stream) - r.xpending(stream, "workers")["pending"]
    second = t.worker(MODEL, name="second")
    live_at = _live_since(r, keys, second.pid, burst)
    burst.join(300)
    shares = _ran_on(t, result[0])
    second_id = next(w for w in shares if f"-{second.pid}-" in w)
    first_id = next(w for w in shares if f"-{first.pid}-" in w)
    # The jobs were still in the stream when it joined (the first worker did not hold them), and it took some.
    assert waiting_when_joined >= 16 and shares[second_id] >= 4, (waiting_when_joined, shares)
    assert shares[first_id] + shares[second_id] == 48
    # It started its first job at once, while the backlog it joined still waited: the first worker took jobs from
    # it after that (an order of events, not a wall-clock bound; its read loop and first heartbeat start together).
    taken = {job: (float(r.hget(keys.job(job), "taken")), r.hget(keys.job(job), "worker").decode())
             for job in result[0]}
    first_taken = min(at for at, worker in taken.values() if worker == second_id)
    assert any(at > first_taken for at, worker in taken.values() if worker == first_id), (first_taken, live_at)


def _live_since(r: redis.Redis, keys: Keys, pid: int, burst: threading.Thread) -> float:
    """When the worker with this pid first heartbeats (it is live and reading from then on)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and burst.is_alive():
        if any(f"-{pid}-" in m.decode() for m in r.zrange(keys.workers(MODEL, "CPU"), 0, -1)):
            return time.time()
        time.sleep(0.02)
    raise AssertionError("the second worker never went live during the burst")
