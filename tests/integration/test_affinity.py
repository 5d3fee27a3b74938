"""Prefix affinity with two workers of SmolLM2 (prefix caching on, so the default OVQ_AFFINITY=auto turns it on): a
conversation's next turn runs on the worker that ran its last one, a `prompt_cache_key` steers it the same way, and a
job waiting in a stopped worker's affinity stream is stolen by the other once it waited OVQ_AFFINITY_STEAL_MS."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, Tiers

SYSTEM = "You are the help desk of a large library. " + "Answer briefly and politely, citing the shelf. " * 12


@pytest.fixture(scope="module")
def fleet(redis_url: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    models = {MODEL: {"path": str(model_dir), "cache_size": 0, "enable_prefix_caching": True}}
    t = Tiers(redis_url, tmp_path_factory.mktemp("affinity"), models,
              OVQ_AFFINITY_STEAL_MS="1000", OVQ_WORKER_TTL_S="30")
    t.api()
    t.worker(MODEL, name="a")
    t.worker(MODEL, name="b")
    t.wait_served(MODEL, workers=2)
    yield t
    t.stop()


def _chat(t: Tiers, messages: list[dict], rid: str, session: str | None = None, **extra: object) -> str:
    headers = {"X-Request-Id": rid, **({"X-Ovq-Session": session} if session else {})}
    response = httpx.post(f"{t.base_url}/chat/completions", timeout=300, headers=headers,
                          json={"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, **extra})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def _worker(t: Tiers, rid: str) -> str:
    return t.redis().hget(t.keys.job(rid, MODEL), "worker").decode()


def _conversation(i: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Visitor {i} asks: where are the books about the number {i}? " * 4}]


def test_a_conversations_next_turns_run_on_the_worker_that_ran_its_first(fleet: Tiers) -> None:
    t = fleet
    conversations = {i: _conversation(i) for i in range(3)}
    first = {}
    for i, messages in conversations.items():
        messages.append({"role": "assistant", "content": _chat(t, messages, f"c{i}-1")})
        first[i] = _worker(t, f"c{i}-1")
    for turn in (2, 3):
        for i, messages in conversations.items():
            messages.append({"role": "user", "content": f"And on which floor, for visitor {i}?"})
            messages.append({"role": "assistant", "content": _chat(t, messages, f"c{i}-{turn}")})
            assert _worker(t, f"c{i}-{turn}") == first[i], f"conversation {i}, turn {turn}"
    # A `prompt_cache_key` names the conversation outright: a short prompt (no prefix block) still follows it.
    _chat(t, [{"role": "user", "content": "hi"}], "k-1", prompt_cache_key="session-7")
    owner = _worker(t, "k-1")
    for n in range(2, 5):
        _chat(t, [{"role": "user", "content": f"hello {n}"}], f"k-{n}", prompt_cache_key="session-7")
        assert _worker(t, f"k-{n}") == owner
    # So does the session header, for clients that cannot add a field.
    _chat(t, [{"role": "user", "content": "hi"}], "h-1", session="session-8")
    owner = _worker(t, "h-1")
    for n in range(2, 4):
        _chat(t, [{"role": "user", "content": f"hello {n}"}], f"h-{n}", session="session-8")
        assert _worker(t, f"h-{n}") == owner


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
        messages.append({"role": "user", "content": "And which floor?"})
        _chat(t, messages, "s-2")
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
