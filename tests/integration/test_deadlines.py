"""Deadlines act before they pass: what the queue cannot start in time is refused at once (429, Retry-After), a job
whose deadline passes while it waits is never started, one whose deadline passes while it runs is cancelled. The
openai SDK's read timeout (X-Stainless-Read-Timeout) is a deadline for the first byte when none other is given.

One worker that runs one sequence at a time: a queue builds behind it, observably."""
from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MODEL, Tiers
from tests.integration import sse

LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True}


@pytest.fixture(scope="module")
def single(redis_url: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    t = Tiers(redis_url, tmp_path_factory.mktemp("deadlines"),
              {MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 1}})
    t.api()
    t.worker(MODEL)
    t.wait_served(MODEL)
    yield t
    t.stop()


def _post(t: Tiers, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{t.base_url}/completions", json=body, headers=headers, timeout=300)


def _waiting(t: Tiers) -> int:
    r = t.redis()
    stream = t.keys.jobs(MODEL, "CPU")
    return r.xlen(stream) - r.xpending(stream, "workers")["pending"]


def _saturate(t: Tiers, pool: ThreadPoolExecutor, n: int) -> list:
    busy = [pool.submit(_post, t, LONG) for _ in range(n)]
    until = time.monotonic() + 60
    while _waiting(t) < n - 2:
        assert time.monotonic() < until, "the queue never built"
        time.sleep(0.05)
    return busy


def test_deadline_passing_while_waiting_never_starts_the_job(single: Tiers) -> None:
    """Nothing has finished yet, so nothing can be estimated: the request waits, its deadline passes, it is a
    504 and its job leaves the stream unrun."""
    r = single.redis()
    with ThreadPoolExecutor(8) as pool:
        busy = _saturate(single, pool, 4)
        late = _post(single, {**LONG, "max_tokens": 4}, **{"X-Request-Timeout": "1", "X-Request-Id": "late-1"})
        assert late.status_code == 504, late.text
        assert late.json()["error"]["code"] == "deadline_exceeded"
        assert r.hget(single.keys.job("late-1", MODEL), "status") == b"cancelled"  # taken back, never running
        assert all(f.result().status_code == 200 for f in busy)
    assert r.hget(single.keys.job("late-1", MODEL), "worker") is None, "no worker ever took it"


def test_deadline_refused_up_front(single: Tiers) -> None:
    """Once the model's rate is measured, a request that cannot start in time is a 429 at once, with Retry-After,
    naming its deadline and the estimated wait; the SDK's read timeout does the same for a stream."""
    for _ in range(2):  # the rate: jobs finished lately
        assert _post(single, LONG).status_code == 200
    sdk = openai.OpenAI(base_url=single.base_url, api_key="unused", max_retries=0)
    with ThreadPoolExecutor(12) as pool:
        busy = _saturate(single, pool, 10)
        refused = _post(single, LONG, **{"X-Request-Timeout": "0.5"})
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "deadline_unreachable" and error["type"] == "rate_limit_error"
        assert "X-Request-Timeout" in error["message"] and "estimated wait" in error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        with pytest.raises(openai.RateLimitError) as caught:  # a stream whose first chunk cannot come in time
            sdk.with_options(timeout=0.5).completions.create(model=MODEL, prompt="Hi", max_tokens=8, stream=True)
        ahead = _waiting(single)  # the refusals came while jobs queued before them still waited: at once
        assert caught.value.status_code == 429 and "X-Stainless-Read-Timeout" in caught.value.message
        patient = sdk.with_options(timeout=300).completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        assert patient.choices[0].text
        assert all(f.result().status_code == 200 for f in busy)
    assert ahead >= 1 and _waiting(single) == 0
    # The ops page counts them, as every API process adds them up in Redis (at most a second later).
    origin, until = single.base_url.rsplit("/", 1)[0], time.monotonic() + 30
    while True:
        streams = httpx.get(f"{origin}/ops/data", timeout=30).json()["streams"]
        refused = next(s for s in streams if s["model"] == MODEL)["stats"]["refused"]
        if refused["deadline"] >= 2:
            break
        assert time.monotonic() < until, refused
        time.sleep(0.2)


def test_running_job_past_its_deadline_is_cancelled(single: Tiers) -> None:
    body = {**LONG, "max_tokens": 4000, "stream": True}
    with httpx.stream("POST", f"{single.base_url}/completions", json=body, timeout=300,
                      headers={"X-Request-Timeout": "2", "X-Request-Id": "overdue-1"}) as response:
        assert response.status_code == 200
        lines = [line for line in sse.lines(response) if line.startswith("data:")]
    assert any("deadline" in line for line in lines[-3:]), lines[-3:]
    r = single.redis()
    until = time.monotonic() + 30
    while r.hget(single.keys.job("overdue-1", MODEL), "status") not in (b"cancelled", b"error"):
        assert time.monotonic() < until, r.hgetall(single.keys.job("overdue-1", MODEL))
        time.sleep(0.1)
    assert int(r.hget(single.keys.job("overdue-1", MODEL), "completion_tokens") or 0) < 4000
