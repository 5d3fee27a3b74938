"""Operators steer real processes: dead consumers leave the group, a dead API process's jobs are cancelled, a
worker drains on `ovq worker drain`, and both tiers' /metrics pass `promtool check metrics`."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from openai import OpenAI

from common.jobs import Job, SamplingParams
from common.keys import GROUP, Keys
from tests.conftest import MODEL, MODELS, ROOT, Tiers, free_port
from tests.integration import sse

TINY = "tiny-llama"


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def live_workers(r: redis.Redis, keys: Keys, model: str) -> list[str]:
    return [m.decode() for m in r.zrangebyscore(keys.workers(model, "CPU"), time.time() - 3, "+inf")]


def consumers(r: redis.Redis, stream: str) -> set[str]:
    return {c["name"].decode() for c in r.xinfo_consumers(stream, GROUP)}


def jobs(r: redis.Redis, keys: Keys) -> dict[str, dict[bytes, bytes]]:
    return {k.decode().rsplit(":", 1)[1]: r.hgetall(k) for k in r.scan_iter(keys.job("*", "*"))}


def test_dead_consumers_are_removed_from_the_group(tiers: Callable[..., Tiers], redis_client: redis.Redis) -> None:
    t = tiers({TINY: {"path": str(MODELS / TINY), "cache_size": 0}})
    t.api()
    t.worker(TINY)
    t.wait_served(TINY)
    keys, stream = t.keys, t.keys.jobs(TINY, "CPU")
    [worker] = live_workers(redis_client, keys, TINY)
    # Two workers that died: one that had finished its job (Redis 6.2 makes a consumer only when it gets an
    # entry), one holding a job it had taken. Added and taken in one transaction: the live worker cannot get them.
    done = Job(model=TINY, device="CPU", kind="completion", prompt="a", reply_to="nobody")
    job = Job(model=TINY, device="CPU", kind="completion", prompt="a b", params=SamplingParams(max_tokens=3),
              reply_to="nobody")
    tx = redis_client.pipeline(transaction=True)
    tx.xadd(stream, done.to_fields())
    tx.xreadgroup(GROUP, "ghost-idle", {stream: ">"}, count=1)
    tx.xadd(stream, job.to_fields())
    tx.xreadgroup(GROUP, "ghost-holding", {stream: ">"}, count=1)
    first, *_ = tx.execute()
    redis_client.xack(stream, GROUP, first)
    redis_client.xdel(stream, first)
    assert {"ghost-idle", "ghost-holding"} <= consumers(redis_client, stream)
    # The held job is taken over (not lost with its consumer: the live worker becomes its consumer) and run.
    wait_for(lambda: redis_client.hget(keys.job(job.id, TINY), "status") == b"done", 30, "the held job ran")
    wait_for(lambda: consumers(redis_client, stream) == {worker}, 30, "dead consumers removed")
    assert redis_client.xlen(stream) == 0


def test_a_worker_that_stops_leaves_no_consumer_behind(tiers: Callable[..., Tiers], redis_client: redis.Redis) -> None:
    """Workers that come and go (autoscaling) each made a consumer in their streams' groups; one that stops with
    nothing pending removes its own, so after two restarts the group holds the live worker's consumer alone. (A
    worker TTL of a minute: no reclaim pass forgets a dead consumer within the test, so only its leaving can.)"""
    t = tiers({TINY: {"path": str(MODELS / TINY), "cache_size": 0}}, OVQ_WORKER_TTL_S="60")
    t.api()
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=60)
    stream = t.keys.jobs(TINY, "CPU")
    for round_ in range(3):
        worker = t.worker(TINY, name=f"w{round_}")
        t.wait_served(TINY)
        client.completions.create(model=TINY, prompt="hello", max_tokens=2)  # its read makes its consumer
        [live] = live_workers(redis_client, t.keys, TINY)
        assert live in consumers(redis_client, stream)
        if round_ < 2:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(60) == 0
            wait_for(lambda: not live_workers(redis_client, t.keys, TINY), 10, "the worker left")
    assert consumers(redis_client, stream) == {live}


def sse_lines(base_url: str, body: dict, first: threading.Event, log: list[str]) -> None:
    try:
        with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=120) as response:
            for line in sse.lines(response):
                if line.startswith("data:"):
                    log.append(line)
                    first.set()
    except httpx.HTTPError as exc:
        log.append(f"ended: {type(exc).__name__}")
    finally:
        first.set()


def test_a_dead_api_process_s_jobs_are_cancelled(tiers: Callable[..., Tiers], model_dir: Path,
                                                 redis_client: redis.Redis) -> None:
    t = tiers({MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 1}}, OVQ_API_TTL_S="2")
    api = t.api()
    worker = t.worker(MODEL)
    t.wait_served(MODEL)
    keys = t.keys
    stream = keys.jobs(MODEL, "CPU")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 1500,
            "stream": True, "ignore_eos": True}
    first, second = threading.Event(), threading.Event()
    logs: list[list[str]] = [[], []]
    threads = [threading.Thread(target=sse_lines, args=(t.base_url, body, first, logs[0]), daemon=True)]
    threads[0].start()
    assert first.wait(60)
    threads.append(threading.Thread(target=sse_lines, args=(t.base_url, body, second, logs[1]), daemon=True))
    threads[1].start()
    wait_for(lambda: redis_client.xlen(stream) == 2, 30, "a second job queued behind the running one")
    states = jobs(redis_client, keys)
    running = next(j for j, h in states.items() if h[b"status"] == b"running")
    queued = next(j for j, h in states.items() if h[b"status"] == b"queued")

    api.send_signal(signal.SIGKILL)
    api.wait(10)
    wait_for(lambda: redis_client.hget(keys.job(running, MODEL), "status") == b"cancelled", 30,
             "the running job cancelled")
    wait_for(lambda: redis_client.hget(keys.job(queued, MODEL), "status") == b"cancelled", 30, "the queued job skipped")
    record = redis_client.hgetall(keys.job(running, MODEL))
    assert b"is gone" in record[b"reason"]
    assert int(record[b"completion_tokens"]) < 1500
    skipped = redis_client.hgetall(keys.job(queued, MODEL))
    assert b"worker" not in skipped and b"is gone" in skipped[b"reason"]  # never started
    wait_for(lambda: redis_client.xlen(stream) == 0, 10, "both acked")
    assert worker.poll() is None
    log = t.log(worker)
    assert "cancelling 1 running jobs: their API process is gone" in log, log[-2000:]


def test_a_worker_drains_on_ovq_worker_drain(tiers: Callable[..., Tiers], model_dir: Path,
                                             redis_client: redis.Redis) -> None:
    # A request nobody takes waits this long for a worker (scale from zero), then is a 503.
    t = tiers({MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 4}}, OVQ_QUEUE_TIMEOUT_S="5")
    t.api()
    worker = t.worker(MODEL)
    t.wait_served(MODEL)
    keys = t.keys
    [worker_id] = live_workers(redis_client, keys, MODEL)
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count."}],
                                            max_tokens=48, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)  # running
    drain = subprocess.run([sys.executable, "-m", "cli.main", "worker", "drain", worker_id, "--wait"], cwd=ROOT,
                           env=t.env, capture_output=True, text=True, timeout=120)
    assert drain.returncode == 0, drain.stderr
    assert "drain requested" in drain.stdout and "gone" in drain.stdout
    rest = list(chunks)
    assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == ["length"]
    assert rest[-1].usage.completion_tokens == 48  # the running job finished
    assert worker.wait(30) == 0
    assert "an operator asked it to drain" in t.log(worker)
    assert not redis_client.exists(keys.drain(worker_id))  # the worker's leaving deleted the request
    refused = httpx.post(f"{t.base_url}/chat/completions", timeout=30,
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert refused.status_code == 503  # nobody serves it now: the worker took no new job
    assert redis_client.xlen(keys.jobs(MODEL, "CPU")) == 0  # and the request left the stream


def test_promtool_accepts_the_api_and_worker_metrics(tiers: Callable[..., Tiers]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    t = tiers({TINY: {"path": str(MODELS / TINY), "cache_size": 0}})
    t.api()
    port = free_port()
    t.worker(TINY, OVQ_WORKER_PORT=str(port), OVQ_WORKER_HOST="127.0.0.1")
    t.wait_served(TINY)
    httpx.post(f"{t.base_url}/completions", json={"model": TINY, "prompt": "a b", "max_tokens": 4},
               timeout=60).raise_for_status()
    for url in (f"http://127.0.0.1:{t.port}/metrics", f"http://127.0.0.1:{port}/metrics"):
        text = httpx.get(url, timeout=10).text
        assert "ovq_" in text
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                                 timeout=30)
        assert checked.returncode == 0, f"{url}:\n{checked.stdout}{checked.stderr}"


def test_job_hashes_keep_counts_and_the_text_only_on_request(tiers: Callable[..., Tiers],
                                                             redis_client: redis.Redis) -> None:
    """Two workers of the same weights: one with the defaults, one keeping texts and logging each job."""
    model = {"path": str(MODELS / TINY), "cache_size": 0}
    t = tiers({TINY: model, "tiny-kept": model})
    t.api()
    plain = t.worker(TINY, name="plain")
    kept = t.worker("tiny-kept", name="kept", OVQ_KEEP_JOB_TEXT="1", OVQ_LOG_JOBS="1")
    t.wait_served(TINY, "tiny-kept")
    keys = t.keys
    for name, worker, keep in ((TINY, plain, False), ("tiny-kept", kept, True)):
        answer = httpx.post(f"{t.base_url}/completions", json={"model": name, "prompt": "a b", "max_tokens": 6,
                                                                  "ignore_eos": True},
                            timeout=60).json()
        [(job_id, record)] = [(j, r) for j, r in jobs(redis_client, keys).items() if r[b"model"] == name.encode()]
        assert record[b"status"] == b"done" and record[b"completion_tokens"] == b"6" and b"total_ms" in record
        assert record[b"worker"] and record[b"api"].startswith(b"api-")
        assert record.get(b"text") == (answer["choices"][0]["text"].encode() if keep else None)
        line = f"job {job_id} model={name} device=CPU status=done prompt_tokens="
        wait_for(lambda: not keep or line in t.log(worker), 10, "the job's log line")  # noqa: B023
        assert (line in t.log(worker)) == keep
