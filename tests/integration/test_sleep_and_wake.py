"""Sleep and wake: a worker releases its engine (weights, KV cache: the engine process ends) while its own process,
heartbeat and card stay; a job, `ovq worker wake` or the ops page starts the engine again in the same process."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from common.keys import Keys
from tests.conftest import MODELS, ROOT, Tiers

TINY = "tiny-llama"
MODELS_FILE = {TINY: {"path": str(MODELS / TINY), "cache_size": 0, "max_num_seqs": 4}}


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def children(pid: int) -> list[int]:
    """A worker's engine processes: its children started by multiprocessing's spawn (not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
                found.append(int(entry.name))
    return found


def the_worker(r: redis.Redis, keys: Keys) -> tuple[str, dict[str, str]]:
    [worker] = r.zrangebyscore(keys.workers(TINY, "CPU"), time.time() - 3, "+inf")
    return worker.decode(), {k.decode(): v.decode() for k, v in r.hgetall(keys.worker(worker.decode())).items()}


def state(r: redis.Redis, keys: Keys, worker: str) -> str:
    return (r.hget(keys.worker(worker), "state") or b"").decode()


def chat(t: Tiers) -> httpx.Response:
    return httpx.post(f"{t.base_url}/chat/completions", timeout=120,
                      json={"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                            "ignore_eos": True})


def ovq(t: Tiers, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=t.env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def test_a_sleeping_worker_wakes_for_a_job_in_the_same_process(tiers: Callable[..., Tiers]) -> None:
    t = tiers(MODELS_FILE)
    t.api()
    t.worker(TINY)
    t.wait_served(TINY)
    r, keys = t.redis(), t.keys
    assert chat(t).status_code == 200
    worker, fields = the_worker(r, keys)
    pid = int(fields["pid"])
    assert fields["state"] == "awake" and children(pid), "an engine process under the worker"

    done = ovq(t, "worker", "sleep", worker, "--wait", "60")
    assert done.returncode == 0, done.stderr
    assert state(r, keys, worker) == "asleep"
    wait_for(lambda: not children(pid), 30, "its engine process gone")
    time.sleep(2)  # asleep, it still heartbeats: the API still counts it, and queues for it
    assert the_worker(r, keys)[0] == worker

    reply = chat(t)  # a job wakes it
    assert reply.status_code == 200, reply.text
    # Random weights can decode to an empty string: the tokens generated are the proof.
    assert reply.json()["usage"]["completion_tokens"] == 4, reply.text
    wait_for(lambda: state(r, keys, worker) == "awake", 10, "awake (at its next heartbeat)")
    again, fields = the_worker(r, keys)
    assert again == worker and int(fields["pid"]) == pid and os.path.exists(f"/proc/{pid}"), "the same process"
    assert float(fields["woke_in_s"]) > 0
    assert children(pid), "an engine process again"


def test_operators_put_a_worker_to_sleep_and_wake_it(tiers: Callable[..., Tiers]) -> None:
    """The ops page's button puts it to sleep; `ovq worker wake` wakes it; `ovq status` shows the state."""
    t = tiers(MODELS_FILE)
    t.api()
    t.worker(TINY)
    t.wait_served(TINY)
    r, keys = t.redis(), t.keys
    worker, _ = the_worker(r, keys)
    ops = f"http://127.0.0.1:{t.port}/ops"
    reply = httpx.post(f"{ops}/workers/{worker}/sleep", headers={"accept": "application/json"}, timeout=10)
    assert reply.status_code == 200 and reply.json()["ok"], reply.text
    wait_for(lambda: state(r, keys, worker) == "asleep", 60, "asleep")
    shown = httpx.get(f"{ops}/data", timeout=10).json()["workers"]
    assert [w["state"] for w in shown if w["id"] == worker] == ["asleep"]
    assert "asleep" in ovq(t, "status").stdout
    assert 'action="/ops/workers/' + worker + '/wake"' in httpx.get(f"{ops}/panel", timeout=10).text

    done = ovq(t, "worker", "wake", worker, "--wait", "60")
    assert done.returncode == 0 and "awake" in done.stdout, done.stderr
    assert chat(t).status_code == 200
    bad = httpx.post(f"{ops}/workers/{worker}/nap", headers={"accept": "application/json"}, timeout=10)
    assert bad.status_code == 404 and bad.json()["error"]["type"] == "not_found_error"


def test_an_idle_worker_falls_asleep_by_itself_when_set_to(tiers: Callable[..., Tiers]) -> None:
    t = tiers(MODELS_FILE, OVQ_WORKER_SLEEP_AFTER_S="2")
    t.api()
    t.worker(TINY)
    t.wait_served(TINY)
    r, keys = t.redis(), t.keys
    worker, _ = the_worker(r, keys)
    wait_for(lambda: state(r, keys, worker) == "asleep", 60, "asleep after 2 s idle")
    assert chat(t).status_code == 200  # a job wakes it (its heartbeat says so within a beat)
    wait_for(lambda: r.hget(keys.worker(worker), "woke_in_s"), 10, "its wake recorded")
