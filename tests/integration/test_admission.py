"""A continuous-batching worker stops at the knee of its throughput curve (here: at the model's target_itl_ms), so
a burst leaves work in the stream, and a worker that joins during it takes a fair part of what waits."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis
from openai import OpenAI

from common.keys import Keys
from tests.conftest import MODELS, Tiers

MODEL = "tiny-llama"
BURST = 120


def _streams(t: Tiers, n: int, max_tokens: int) -> list[str]:
    """n concurrent streamed chats, read to their end; the job id of each."""
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=300)
    ids: list[str] = []

    def one(i: int) -> None:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write a story about the number {i}."}],
            max_tokens=max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True})
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        ids.append(chunks[0].id.removeprefix("chatcmpl-"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    return ids


def _waiting(r: redis.Redis, stream: str) -> int:
    return r.xlen(stream) - r.xpending(stream, "workers")["pending"]


def test_a_worker_joining_a_burst_takes_a_third_of_what_waits(tiers: Callable[..., Tiers]) -> None:
    # A target ITL no step meets: once its curve is fitted, each worker holds the floor (16), far short of the burst.
    models = {MODEL: {"path": str(MODELS / MODEL), "cache_size": 0, "max_num_seqs": 256, "target_itl_ms": 1}}
    t = tiers(models)
    t.api()
    first = t.worker(MODEL, name="first")
    t.wait_served(MODEL)
    r = t.redis()
    keys = t.keys
    stream = keys.jobs(MODEL, "CPU")
    # Warm-up: a worker that has not fitted its curve yet admits up to twice what it measured (it explores); one
    # that has holds its limit. So first let it learn (a fit's knee is below max_num_seqs), then burst.
    first_id = _worker_of(r, keys, first.pid)
    deadline = time.monotonic() + 120
    while int(r.hget(keys.worker(first_id), "admission_knee") or 256) >= 256:
        assert time.monotonic() < deadline, "the worker fitted no throughput curve"
        _streams(t, 48, 48)
    result: list[list[str]] = []
    burst = threading.Thread(target=lambda: result.append(_streams(t, BURST, 1000)))
    burst.start()
    deadline = time.monotonic() + 120
    while _waiting(r, stream) < BURST // 3:  # the first worker took what it could run, the rest waits
        assert time.monotonic() < deadline and burst.is_alive(), "no backlog built up"
        time.sleep(0.05)
    second = t.worker(MODEL, name="second")
    second_id, waiting = _first_heartbeat(r, keys, second.pid, burst)
    assert waiting >= 20, waiting  # still a backlog when it joined: the first worker did not hold the burst
    deadline = time.monotonic() + 120
    while not int(r.hget(keys.worker(second_id), "jobs_taken") or 0):  # it owns waiting jobs soon after
        assert time.monotonic() < deadline and burst.is_alive(), "the second worker took no job"
        time.sleep(0.05)
    burst.join(600)
    assert not burst.is_alive() and len(result[0]) == BURST
    owners = [r.hget(keys.job(job, MODEL), "worker").decode() for job in result[0]]
    assert owners.count(first_id) + owners.count(second_id) == BURST
    assert owners.count(second_id) >= waiting / 3, (owners.count(second_id), waiting)
    print("FIGURES", waiting, owners.count(second_id), r.hget(keys.worker(first_id), "admission_limit"))
    knee = r.hget(keys.worker(first_id), "admission_limit")
    assert knee is not None and 16 <= int(knee) < BURST, knee  # the limit it learned, in its heartbeat


def _worker_of(r: redis.Redis, keys: Keys, pid: int) -> str:
    return next(m.decode() for m in r.zrange(keys.workers(MODEL, "CPU"), 0, -1) if f"-{pid}-".encode() in m)


def _first_heartbeat(r: redis.Redis, keys: Keys, pid: int, burst: threading.Thread) -> tuple[str, int]:
    """The worker with this pid, once it first heartbeats, and how many jobs waited in the stream then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and burst.is_alive():
        members = [m.decode() for m in r.zrange(keys.workers(MODEL, "CPU"), 0, -1)]
        mine = [m for m in members if f"-{pid}-" in m]
        if mine:
            return mine[0], _waiting(r, keys.jobs(MODEL, "CPU"))
        time.sleep(0.02)
    raise AssertionError("the second worker never went live during the burst")
