"""A client that goes away cancels its generation; nothing is left behind."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
import redis
from openai import OpenAI

from common.jobs import JobHash, JobStatus
from common.keys import GROUP
from tests.conftest import MODEL, ON_CLUSTER, SINGLE, Stack, test_keys

KEYS = test_keys("ovqtest")
LONG = {"messages": [{"role": "user", "content": "Tell me a very long story."}], "max_tokens": 4000,
        "extra_body": {"ignore_eos": True}}


def in_flight(r: redis.Redis, model: str) -> int:
    return int(r.xpending(KEYS.jobs(model, "CPU"), GROUP)["pending"])


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def job_statuses(r: redis.Redis) -> dict[bytes, dict[bytes, bytes]]:
    return {k: r.hgetall(k) for k in r.scan_iter(KEYS.job("*", "*" if ON_CLUSTER else ""))}


def test_disconnect_cancels_generation(client: OpenAI, redis_client: redis.Redis) -> None:
    """The job this stream's client named (X-Request-Id names the job) ends cancelled, not another test's."""
    job_id = f"disconnect-{time.time_ns()}"
    response = client.chat.completions.with_raw_response.create(model=MODEL, stream=True,
                                                                extra_headers={"X-Request-Id": job_id}, **LONG)
    assert response.headers["x-request-id"] == job_id
    stream = response.parse()
    received = 0
    for _chunk in stream:
        received += 1
        if received == 5:
            break
    job = KEYS.job(job_id, MODEL)
    assert redis_client.hget(job, JobHash.STATUS) == JobStatus.RUNNING.encode()
    assert in_flight(redis_client, MODEL) == 1
    stream.close()
    assert wait_until(lambda: redis_client.hget(job, JobHash.STATUS) != JobStatus.RUNNING.encode(), timeout=60)
    assert redis_client.hget(job, JobHash.STATUS) == JobStatus.CANCELLED.encode(), redis_client.hgetall(job)
    assert wait_until(lambda: in_flight(redis_client, MODEL) == 0, timeout=60)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.usage.completion_tokens <= 4


def test_dropped_unary_request_cancels_generation(stack: Stack, redis_client: redis.Redis) -> None:
    body = {"model": MODEL, "messages": LONG["messages"], "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{stack.base_url}/chat/completions", json=body, timeout=1.5)
    assert wait_until(lambda: in_flight(redis_client, MODEL) == 0, timeout=1.0)


def test_job_cancelled_while_queued_is_never_started(stack: Stack, client: OpenAI, redis_client: redis.Redis) -> None:
    """SINGLE runs one job at a time: the second waits in Redis; its client leaves before it starts."""
    before = set(job_statuses(redis_client))
    first = client.chat.completions.create(model=SINGLE, stream=True, **LONG)
    next(iter(first))
    assert in_flight(redis_client, SINGLE) == 1

    def doomed() -> None:
        body = {"model": SINGLE, "messages": [{"role": "user", "content": "queued"}], "max_tokens": 3}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{stack.base_url}/chat/completions", json=body, timeout=1.0)

    thread = threading.Thread(target=doomed)
    thread.start()
    assert wait_until(lambda: redis_client.xlen(KEYS.jobs(SINGLE, "CPU")) == 2, timeout=5)
    thread.join()
    first.close()
    assert wait_until(lambda: redis_client.xlen(KEYS.jobs(SINGLE, "CPU")) == 0, timeout=5), \
        (redis_client.xrange(KEYS.jobs(SINGLE, "CPU")), job_statuses(redis_client))
    new = {k: v for k, v in job_statuses(redis_client).items() if k not in before}
    statuses = sorted(v[b"status"] for v in new.values())
    assert statuses == [b"cancelled", b"cancelled"]
    never_started = [v for v in new.values() if b"worker" not in v]
    assert len(never_started) == 1, "the queued job reached the engine"


def test_every_key_a_request_creates_expires(client: OpenAI, redis_client: redis.Redis) -> None:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    stream = client.chat.completions.create(model=MODEL, stream=True, **LONG)
    next(iter(stream))
    stream.close()
    assert wait_until(lambda: in_flight(redis_client, MODEL) == 0, timeout=2)
    for key in redis_client.scan_iter("ovqtest:*"):
        kind = redis_client.type(key)
        if kind in (b"hash", b"string") and (b":job:" in key or b":cancel:" in key or b":worker:" in key):
            assert redis_client.ttl(key) > 0, key
    assert redis_client.xlen(KEYS.jobs(MODEL, "CPU")) == 0
