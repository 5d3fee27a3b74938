"""Priorities: vLLM's `priority` field and the X-Ovq-Priority header put a job on its level's stream; a worker
takes the highest level first, ages a lower level's job in once it has waited OVQ_PRIORITY_AGING_S, and only a key
whose entry in the (YAML) key file allows it may ask for more than the default.

One worker that runs one sequence at a time: the order it takes jobs in is observable (each job hash's `taken`)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.conftest import MODEL, Tiers

BOSS, PLAIN = "sk-boss", "sk-plain"
AGING_S = 2


def _start(t: Tiers) -> Tiers:
    t.api()
    t.worker(MODEL)
    t.wait_served(MODEL)
    return t


def _tiers(redis_url: str, model_dir: Path, work: Path, aging_s: float) -> Tiers:
    (work / "keys.yaml").write_text(f"keys:\n  - {{key: {BOSS}, tenant: ops, max_priority: high}}\n"
                                    f"  - {{key: {PLAIN}, name: someone}}\n")
    return Tiers(redis_url, work, {MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 1}},
                 OVQ_API_KEY_FILE=str(work / "keys.yaml"), OVQ_PRIORITY_AGING_S=str(aging_s))


@pytest.fixture()
def single(redis_url: str, model_dir: Path, tmp_path: Path) -> Iterator[Tiers]:
    """No aging within this test's waits: the order is the levels' alone."""
    t = _start(_tiers(redis_url, model_dir, tmp_path, 600))
    yield t
    t.stop()


@pytest.fixture()
def aging(redis_url: str, model_dir: Path, tmp_path: Path) -> Iterator[Tiers]:
    t = _start(_tiers(redis_url, model_dir, tmp_path, AGING_S))
    yield t
    t.stop()


def _post(t: Tiers, rid: str, key: str = PLAIN, max_tokens: int = 12, **body: object) -> httpx.Response:
    return httpx.post(f"{t.base_url}/completions", timeout=300,
                      headers={"Authorization": f"Bearer {key}", "X-Request-Id": rid},
                      json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens,
                            "ignore_eos": True, **body})


def _waiting(t: Tiers, r: redis.Redis) -> int:
    keys = t.keys
    streams = [keys.level_jobs(MODEL, "CPU", level) for level in ("high", "interactive", "low")]
    return sum(r.xlen(s) for s in streams if r.exists(s)) - 1  # the running one is still in its stream


def _running(t: Tiers, r: redis.Redis, rid: str) -> None:
    """Until a worker runs the job: what is sent next waits behind it."""
    until = time.monotonic() + 60
    while r.hget(t.keys.job(rid, MODEL), "status") != b"running":
        assert time.monotonic() < until
        time.sleep(0.02)


def _taken(t: Tiers, r: redis.Redis, rid: str) -> float:
    return float(r.hget(t.keys.job(rid, MODEL), "taken"))


def test_higher_priority_runs_first_and_raising_it_takes_a_key_that_may(single: Tiers) -> None:
    r = single.redis()
    sdk = openai.OpenAI(base_url=single.base_url, api_key=PLAIN, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        sdk.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"priority": -1})
    assert caught.value.status_code == 403 and "priority" in caught.value.message
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "extra_body": {"service_tier": "priority"}}  # OpenAI's name for the high level
    with pytest.raises(openai.PermissionDeniedError):
        sdk.chat.completions.create(**chat)
    boss = openai.OpenAI(base_url=single.base_url, api_key=BOSS, max_retries=0)
    assert boss.chat.completions.create(**chat).service_tier == "priority"
    with ThreadPoolExecutor(8) as pool:
        blocker = pool.submit(_post, single, "p-block", max_tokens=32)
        _running(single, r, "p-block")
        sent = [("p-low", {"priority": 5}), ("p-batch", {}), ("p-mid", {}), ("p-high", {"priority": -1})]
        futures = []
        for rid, extra in sent:
            headers_key = BOSS if rid == "p-high" else PLAIN
            if rid == "p-batch":
                futures.append(pool.submit(lambda: httpx.post(
                    f"{single.base_url}/completions", timeout=300, json={"model": MODEL, "prompt": "Hi",
                                                                         "max_tokens": 4},
                    headers={"Authorization": f"Bearer {PLAIN}", "X-Request-Id": "p-batch",
                             "X-Ovq-Priority": "batch"})))
            else:
                futures.append(pool.submit(_post, single, rid, headers_key, **extra))
            time.sleep(0.05)
        assert blocker.result().status_code == 200
        assert all(f.result().status_code == 200 for f in futures), [f.result().text for f in futures]
    # Those still waiting once all four were queued (a worker may have taken the first at once) by level.
    queued = max(float(r.hget(single.keys.job(rid, MODEL), "created")) for rid, _ in sent)
    waited = [rid for rid in sorted((rid for rid, _ in sent), key=lambda rid: _taken(single, r, rid))
              if _taken(single, r, rid) > queued]
    assert len(waited) >= 3, waited
    assert waited == [rid for rid in ("p-high", "p-mid", "p-low", "p-batch") if rid in waited], \
        {rid: r.hgetall(single.keys.job(rid, MODEL)) for rid in ("p-block", *(rid for rid, _ in sent))}


def test_low_priority_ages_in(aging: Tiers) -> None:
    """A low-priority job behind a stream of interactive ones that outlasts the aging bound: it does not run last."""
    single = aging
    r = single.redis()
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(_post, single, "a-block", max_tokens=32)]
        _running(single, r, "a-block")
        futures.append(pool.submit(_post, single, "a-low", priority=1))
        time.sleep(0.05)
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < AGING_S * 4 or n < 6:  # interactive work keeps coming
            futures.append(pool.submit(_post, single, f"a-{n}"))
            n += 1
            time.sleep(0.3)
        assert all(f.result().status_code == 200 for f in futures)
    interactive = [_taken(single, r, f"a-{i}") for i in range(n)]
    low = _taken(single, r, "a-low")
    assert low < max(interactive), "without aging it would have waited for every interactive job"
    assert sum(t > low for t in interactive) >= 2, "it was taken ahead of interactive jobs queued before it started"
