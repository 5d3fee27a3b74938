"""What operators rely on: health, metrics, and jobs of dead workers picked up by live ones."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis
from openai import OpenAI

from common.jobs import Job, SamplingParams
from common.keys import GROUP
from tests.conftest import IMAGE, MODEL, ON_CLUSTER, SINGLE, STATEFUL, STATEFUL_VLM, TOOLS, VLM, Stack, test_keys

KEYS = test_keys("ovqtest")


def test_health_reports_ready(stack: Stack) -> None:
    assert httpx.get(stack.url("/v2/health/live")).json() == {"live": True}
    ready = httpx.get(stack.url("/v2/health/ready"))
    assert ready.status_code == 200
    assert ready.json()["models"] == {name: True for name in (MODEL, SINGLE, IMAGE, VLM, STATEFUL, STATEFUL_VLM, TOOLS)}
    assert httpx.get(stack.url("/health")).status_code == 200


def test_metrics_show_queue_depth_and_workers(stack: Stack, client: OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    text = httpx.get(stack.url("/metrics")).text
    labels = f'{{device="CPU",model="{MODEL}"}}'
    assert f"ovq_queue_waiting_jobs{labels} 0.0" in text
    assert f"ovq_queue_in_flight_jobs{labels} 0.0" in text
    assert f"ovq_live_workers{labels} 1.0" in text
    assert 'ovq_requests_total{endpoint="chat",status="200"}' in text


def _orphan(r: redis.Redis, model: str, streamed: bool) -> tuple[Job, redis.client.PubSub]:
    """A job delivered to a consumer that has no heartbeat: a worker that died holding it."""
    job = Job(model=model, device="CPU", kind="completion", prompt="Hello", add_special_tokens=True,
              params=SamplingParams(max_tokens=3), reply_to=f"test-{time.time_ns()}")
    listener = _listen(r, job.reply_to)
    if streamed:
        r.hset(KEYS.job(job.id, model), mapping={"status": "running", "streamed": 1})
    # Added and taken in one transaction, so the live worker (blocked in XREADGROUP) cannot get it first.
    stream = KEYS.jobs(model, "CPU")
    tx = r.pipeline(transaction=True)
    tx.xadd(stream, job.to_fields())
    tx.xreadgroup(GROUP, "ghost-worker", {stream: ">"}, count=1)
    _, taken = tx.execute()
    # XREADGROUP's reply: [[stream, [[id, fields]]]] from one Redis (RESP2), {stream: [[id, fields]]} from a Cluster's
    # transaction, whose fields come unparsed: a flat [field, value, ...] list.
    [(entry_id, fields)] = taken[0][1] if isinstance(taken, list) else taken[stream.encode()]
    fields = fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=True))
    assert Job.from_fields(fields).id == job.id
    return job, listener


def _listen(r: redis.Redis, reply_to: str) -> redis.client.PubSub:
    """Subscribed to an API's event channel as the API is: sharded (SSUBSCRIBE, on its master) on a Cluster."""
    listener = r.pubsub()
    if ON_CLUSTER:
        listener.ssubscribe(KEYS.events(reply_to))
        listener.get_sharded_message(timeout=2)
    else:
        listener.subscribe(KEYS.events(reply_to))
        listener.get_message(timeout=2)
    return listener


def _events(listener: redis.client.PubSub, timeout: float) -> list[dict]:
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(e["type"] in ("done", "error") for e in events):
        message = listener.get_sharded_message(timeout=0.5) if ON_CLUSTER else listener.get_message(timeout=0.5)
        if message and message["type"] in ("message", "smessage"):
            events.extend(orjson.loads(message["data"])["events"])
    return events


def test_dead_workers_unstarted_job_is_run_again(stack: Stack, redis_client: redis.Redis) -> None:
    job, listener = _orphan(redis_client, MODEL, streamed=False)
    events = _events(listener, 20)
    assert [e["type"] for e in events][0] == "accepted"
    assert events[-1]["type"] == "done" and events[-1]["job"] == job.id


def test_dead_workers_half_streamed_job_ends_with_an_error(stack: Stack, redis_client: redis.Redis) -> None:
    stream = KEYS.jobs(SINGLE, "CPU")
    job, listener = _orphan(redis_client, SINGLE, streamed=True)
    events = _events(listener, 20)
    assert [e["type"] for e in events] == ["error"]
    assert "died" in events[0]["error"]["message"]
    assert redis_client.xlen(stream) == 0


def test_a_device_that_cannot_open_fails_the_worker_with_one_line(stack: Stack) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "-m", "workers", "--model", MODEL, "--device", "GPU"], env=stack.env,
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ovq worker: device GPU unavailable for {MODEL}: ") and "\n" not in last


def test_an_unreadable_job_still_gets_its_terminal_event(stack: Stack, redis_client: redis.Redis) -> None:
    """A job from an incompatible API (here: no prompt) goes to the dead-letter stream, and its client hears so."""
    reply_to = f"test-{time.time_ns()}"
    listener = _listen(redis_client, reply_to)
    dead_before = redis_client.xlen(KEYS.dead) if redis_client.exists(KEYS.dead) else 0
    raw = orjson.dumps({"v": 99, "id": "broken-job", "reply_to": reply_to, "model": MODEL})
    redis_client.xadd(KEYS.jobs(MODEL, "CPU"), {"job": raw})
    events = _events(listener, 10)
    assert [(e["type"], e["job"], e["status"]) for e in events] == [("error", "broken-job", 500)]
    assert redis_client.xlen(KEYS.dead) == dead_before + 1


def _engine_pid(model: str, stack: Stack) -> int:
    """The engine process of the model's worker in this stack (other sessions may run stacks of their own):
    the child of `python -m workers --model <model>` started with this stack's models file."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "workers" in cmdline and model in cmdline and proc.environ().get("OVQ_CONFIG") == str(stack.config):
            # Besides the engine, multiprocessing may run its resource tracker.
            live = [c for c in proc.children() if c.status() != psutil.STATUS_ZOMBIE]
            (engine,) = [c for c in live if "spawn_main" in " ".join(c.cmdline())]
            return engine.pid
    raise LookupError(model)


def _crash_engine_after(stream: Iterator[Any], chunks: int, model: str, stack: Stack) -> list[Any]:
    """Read `chunks` chunks with text, then SIGKILL the model's engine: what a native crash looks like from outside
    (GenAI's `malloc(): smallbin double linked list corrupted`, a segfault)."""
    import os
    import signal

    seen = []
    for chunk in stream:
        seen.append(chunk)
        if sum(1 for c in seen if c.choices and c.choices[0].delta.content) >= chunks:
            break
    os.kill(_engine_pid(model, stack), signal.SIGKILL)
    return seen


def test_an_engine_crash_continues_the_jobs_that_went_through_a_step(client: OpenAI, stack: Stack) -> None:
    """The stream had made tokens on the engine that crashed, so it is no suspect: the restarted engine goes on
    from them (as a takeover does) and the client gets all it asked for, one terminal event; then the worker
    serves the next request."""
    stream = client.chat.completions.create(model=SINGLE, messages=[{"role": "user", "content": "Go on and on."}],
                                            max_tokens=120, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}, timeout=120)
    chunks = _crash_engine_after(iter(stream), 5, SINGLE, stack) + list(stream)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 120
    reply = client.chat.completions.create(model=SINGLE, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           timeout=60)
    assert reply.usage.completion_tokens <= 3


def test_a_job_in_two_engine_crashes_fails_into_the_dead_letters(client: OpenAI, stack: Stack,
                                                                 redis_client: redis.Redis) -> None:
    """Nothing names a crash's cause; a job that was running in two of them is the likely one: it ends with one
    error event and its entry goes to the dead-letter stream (`ovq dead`), and the worker serves on."""
    import openai

    job_id = f"crasher-{time.time_ns()}"
    stream = iter(client.chat.completions.create(
        model=SINGLE, messages=[{"role": "user", "content": "Go on and on."}], max_tokens=3000, stream=True,
        extra_body={"ignore_eos": True}, extra_headers={"X-Request-Id": job_id}, timeout=120))
    _crash_engine_after(stream, 3, SINGLE, stack)
    with pytest.raises(openai.APIError, match="crashed"):
        _crash_engine_after(stream, 3, SINGLE, stack)  # the restarted engine has gone on with it: crash it again
        for _ in stream:
            pass
    dead = [orjson.loads(fields[b"job"])["id"] for _, fields in redis_client.xrange(KEYS.dead)]
    assert job_id in dead
    reply = client.chat.completions.create(model=SINGLE, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           timeout=60)
    assert reply.usage.completion_tokens <= 3
