"""Prefix affinity with two workers of SmolLM2 (prefix caching on, so the default OVQ_AFFINITY=auto turns it on): a
conversation's next turn runs on the worker that ran its last one, a `prompt_cache_key` steers it the same way, and a
job waiting in a stopped worker's affinity stream is stolen by the other once it waited OVQ_AFFINITY_STEAL_MS.

The conversations run side by side (as clients do): stickiness then holds while both workers are busy, and the
module takes half the time. The threshold is well above a step on a busy machine, so a next turn waiting for its
worker's room is not stolen by a worker that happens to be idle."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, Tiers

WORKER_TTL_S = 120  # a stopped worker stays live this long: its jobs are stolen, not reclaimed from the dead
SYSTEM = "You are the help desk of a large library. " + "Answer briefly and politely, citing the shelf. " * 12


@pytest.fixture(scope="module")
def fleet(redis_url: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    models = {MODEL: {"path": str(model_dir), "cache_size": 0, "enable_prefix_caching": True}}
    t = Tiers(redis_url, tmp_path_factory.mktemp("affinity"), models,
              OVQ_AFFINITY_STEAL_MS="2500", OVQ_WORKER_TTL_S=str(WORKER_TTL_S))
    t.api()
    t.worker(MODEL, name="a")
    t.worker(MODEL, name="b")
    t.wait_served(MODEL, workers=2)
    yield t
    t.stop()


def _chat(t: Tiers, messages: list[dict], rid: str, session: str | None = None, timeout: float = 300,
          **extra: object) -> str:
    headers = {"X-Request-Id": rid, **({"X-Ovq-Session": session} if session else {})}
    response = httpx.post(f"{t.base_url}/chat/completions", timeout=timeout, headers=headers,
                          json={"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, **extra})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def _worker(t: Tiers, rid: str) -> str:
    return t.redis().hget(t.keys.job(rid, MODEL), "worker").decode()


def _conversation(i: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Visitor {i} asks: where are the books about the number {i}? " * 4}]


def _turn(t: Tiers, i: int, messages: list[dict], turn: int) -> None:
    if turn > 1:
        messages.append({"role": "user", "content": f"And on which floor, for visitor {i}?"})
    messages.append({"role": "assistant", "content": _chat(t, messages, f"c{i}-{turn}")})


def _named(t: Tiers, name: str, n: int, **how: str) -> str:
    """The n-th of a series of short prompts named by a cache key or a session header (`how`)."""
    key, session = how.get("prompt_cache_key"), how.get("session")
    _chat(t, [{"role": "user", "content": "hi" if n == 1 else f"hello {n}"}], f"{name}-{n}", session,
          **({"prompt_cache_key": key} if key else {}))
    return _worker(t, f"{name}-{n}")


def test_a_conversations_next_turns_run_on_the_worker_that_ran_its_first(fleet: Tiers) -> None:
    t = fleet
    conversations = {i: _conversation(i) for i in range(3)}
    with ThreadPoolExecutor(len(conversations)) as pool:
        list(pool.map(lambda i: _turn(t, i, conversations[i], 1), conversations))
        first = {i: _worker(t, f"c{i}-1") for i in conversations}
        for turn in (2, 3):
            list(pool.map(lambda i: _turn(t, i, conversations[i], turn), conversations))  # noqa: B023
            for i in conversations:
                assert _worker(t, f"c{i}-{turn}") == first[i], f"conversation {i}, turn {turn}"
    # A `prompt_cache_key` names the conversation outright: a short prompt (no prefix block) still follows it; so
    # does the session header, for clients that cannot add a field. Both series side by side, each after its first.
    series = {"k": ({"prompt_cache_key": "session-7"}, 4), "h": ({"session": "session-8"}, 3)}
    with ThreadPoolExecutor(5) as pool:
        owners = dict(zip(series, pool.map(lambda name: _named(t, name, 1, **series[name][0]), series), strict=True))
        later = [(name, n) for name, (_, count) in series.items() for n in range(2, count + 1)]
        for (name, n), worker in zip(later, pool.map(lambda job: _named(t, job[0], job[1], **series[job[0]][0]),
                                                     later), strict=True):
            assert worker == owners[name], f"{name}-{n}"


def test_a_job_in_a_stopped_workers_affinity_stream_is_stolen_after_the_threshold(fleet: Tiers) -> None:
    t = fleet
    r = t.redis()
    keys = t.keys
    messages = _conversation(99)
    messages.append({"role": "assistant", "content": _chat(t, messages, "s-1")})
    owner = _worker(t, "s-1")
    pid = int(r.hget(keys.worker(owner), "pid"))
    os.kill(pid, signal.SIGSTOP)  # still live for OVQ_WORKER_TTL_S: the next turn is queued for it
    try:
        # A blocking read it had issued ends within its 1 s block. A job added before that would be delivered to the
        # stopped worker (as to any hung reader) and only reclaimed once it is dead: not what this test is about.
        time.sleep(1.5)
        messages.append({"role": "user", "content": "And which floor?"})
        # Stolen, it ends long before the owner could be declared dead and its jobs reclaimed.
        _chat(t, messages, "s-2", timeout=WORKER_TTL_S / 2)
        thief = _worker(t, "s-2")
        assert thief != owner
        assert r.hget(keys.job("s-2", MODEL), "entry") is not None
        # It waited in the owner's affinity stream, and was acked (deleted) there by the thief.
        assert r.xlen(keys.affinity_jobs(MODEL, "CPU", owner)) == 0
        until = time.monotonic() + 30
        while int(r.hget(keys.worker(thief), "affinity_steals") or 0) < 1:
            assert time.monotonic() < until, "the thief's heartbeat never counted the steal"
            time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
