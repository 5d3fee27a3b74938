"""Faults ovq rides out: an engine step that fails, a hung engine, a killed worker, Redis restarted (with and
without its append-only file) or its clients killed, bursts and disconnect storms.

Every test counts what its clients saw: accepted, completed, failed with a clean error, hung (no answer within
the bound: must be 0), internal errors (HTTP 500 or an "internal error" message: must be 0), and, for the bursts,
broken answers (a connection error, a status the API does not document, a body outside the error envelope: must
be 0).
"""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema
import orjson
import psutil
import pytest

from common.jobs import Job, JobHash, JobStatus, SamplingParams
from common.keys import GROUP
from common.redis.server import EmbeddedRedis
from common.settings import Settings
from common.structured import regex
from tests.conftest import MODEL, MODELS, ON_CLUSTER, Tiers, free_port
from tests.integration import sse
from tests.precision import F32

TINY = "tiny-llama"
BOUND_S = 90  # no request may take longer than this to end, one way or the other


@dataclass
class Counts:
    accepted: int = 0
    completed: int = 0
    failed: int = 0  # a clean error: the OpenAI envelope, or an error event, with a message
    hung: int = 0
    internal: int = 0
    broken: int = 0  # neither an answer nor a documented refusal: a connection error, an undocumented body
    errors: list[str] = field(default_factory=list)  # the messages of failures, for the assertion's message

    def __str__(self) -> str:
        return (f"accepted {self.accepted}, completed {self.completed}, failed cleanly {self.failed}, "
                f"hung {self.hung}, internal errors {self.internal}, broken {self.broken}; errors: {self.errors[:5]}")

    def __post_init__(self) -> None:
        MADE.append(self)

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)


MADE: list[Counts] = []


@pytest.fixture(autouse=True)
def _say_the_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test's counts, printed (`pytest -s` or `-rP` shows them): the figures the issue's table asks for."""
    MADE.clear()
    yield
    for counts in MADE:
        print(f"{request.node.name}: accepted {counts.accepted}, completed {counts.completed}, failed cleanly "
              f"{counts.failed}, hung {counts.hung}, internal errors {counts.internal}, broken {counts.broken}")


def tiny(**options: object) -> dict[str, dict]:
    return {TINY: {"path": str(MODELS / TINY), "cache_size": 0, **options}}


def stream(base_url: str, body: dict, counts: Counts, started: threading.Event | None = None,
           timeout: float = BOUND_S) -> None:
    """One streamed request, counted by how it ended."""
    lock = threading.Lock()
    try:
        with httpx.stream("POST", f"{base_url}/chat/completions", json={**body, "stream": True},
                          timeout=timeout) as response:
            if response.status_code != 200:
                response.read()
                error = response.json().get("error", {})
                outcome = "internal" if response.status_code == 500 or not error.get("message") else "failed"
            else:
                with lock:
                    counts.accepted += 1
                outcome = "hung"
                for line in sse.lines(response):
                    if line.startswith("data: {"):
                        data = orjson.loads(line[6:])
                        if started is not None and data.get("choices") and data["choices"][0]["delta"].get("content"):
                            started.set()  # a token reached the client: the job has streamed
                        if "error" in data:
                            message = data["error"].get("message") or ""
                            counts.errors.append(message)
                            outcome = "internal" if message in ("", "internal error") else "failed"
                        elif data["choices"] and data["choices"][0].get("finish_reason"):
                            outcome = "completed"
    except httpx.TimeoutException:
        outcome = "hung"
    except httpx.TransportError as exc:  # a body cut mid-chunk, a connection refused: neither answer nor refusal
        counts.errors.append(f"{type(exc).__name__}: {exc}")
        outcome = "broken"
    finally:
        if started is not None:
            started.set()
    with lock:
        counts.add(outcome)


def long_stream(t: Tiers, counts: Counts) -> threading.Thread:
    """A 1,900-token stream of the tiny model, started and past its first token."""
    started = threading.Event()
    body = {"model": TINY, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1900, "ignore_eos": True}
    thread = threading.Thread(target=stream, args=(t.base_url, body, counts, started))
    thread.start()
    assert started.wait(60)
    return thread


def unary(base_url: str, body: dict, counts: Counts, timeout: float = BOUND_S) -> None:
    try:
        response = httpx.post(f"{base_url}/chat/completions", json=body, timeout=timeout)
    except httpx.TimeoutException:
        counts.add("hung")
        return
    if response.status_code == 200:
        counts.accepted += 1
        counts.add("completed")
    else:
        counts.errors.append(f"{response.status_code} {response.text[:200]}")
        counts.add("internal" if response.status_code == 500 else "failed")


def in_threads(n: int, target: Callable[[int], None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(BOUND_S + 30)


def engine_of(worker: psutil.Process) -> psutil.Process:
    (engine,) = [c for c in worker.children() if c.status() != psutil.STATUS_ZOMBIE
                 and "spawn_main" in " ".join(c.cmdline()) and "resource_tracker" not in " ".join(c.cmdline())]
    return engine


def worker_process(proc: object) -> psutil.Process:
    """The worker itself: `ovq worker` exec'ed it, so it is the process we started."""
    return psutil.Process(proc.pid)  # type: ignore[attr-defined]


HELLO = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_a_failed_step_fails_only_its_culprit(tiers: Callable[..., Tiers], model_dir: Path,
                                              redis_url: str) -> None:
    """A job whose grammar the engine cannot compile (it got past the API's checks: here it is put on the stream
    directly) breaks the step it joins; it alone fails, with a 400, and the jobs running beside it go on."""
    t = tiers({MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 8}})
    t.api()
    worker = t.worker(MODEL)
    t.wait_served(MODEL)
    counts, started = Counts(), [threading.Event() for _ in range(3)]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to a hundred."}], "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}
    threads = in_threads(3, lambda i: stream(t.base_url, body, counts, started[i]))
    for event in started:
        assert event.wait(60)
    r = t.redis()
    keys = t.keys
    culprit = Job(model=MODEL, device="CPU", kind="completion", prompt="Hello", reply_to=f"test-{time.time_ns()}",
                  params=SamplingParams(max_tokens=4, structured=regex("(?=a)a+")))
    listener = r.pubsub()
    if keys.cluster:  # the workers SPUBLISH there: sharded pub/sub, on the channel's master
        listener.ssubscribe(keys.events(culprit.reply_to))
    else:
        listener.subscribe(keys.events(culprit.reply_to))
    r.xadd(keys.jobs(MODEL, "CPU"), culprit.to_fields())
    events: list[dict] = []
    deadline = time.monotonic() + 60
    while not any(e["type"] in ("done", "error") for e in events) and time.monotonic() < deadline:
        message = listener.get_sharded_message(timeout=1) if keys.cluster else listener.get_message(timeout=1)
        if message and message["type"] in ("message", "smessage"):
            events.extend(orjson.loads(message["data"])["events"])
    join(threads)
    assert [(e["type"], e["status"]) for e in events] == [("error", 400)], events
    assert "invalid structured output" in events[0]["error"]["message"]
    assert counts.completed == 3 and counts.hung == counts.internal == 0, counts
    assert "engine step failed" in t.log(worker)
    unary(t.base_url, {**body, "max_tokens": 3}, counts)
    assert counts.completed == 4, counts


def test_a_hung_engine_is_killed_by_the_watchdog_and_replaced(tiers: Callable[..., Tiers]) -> None:
    """The stream had made tokens on the engine that hung, so it is no suspect: the replacement engine goes on with
    it, and it completes; then the replacement serves the next request."""
    t = tiers(tiny(), OVQ_ENGINE_WATCHDOG_S="2")
    t.api()
    worker = t.worker(TINY)
    t.wait_served(TINY)
    counts = Counts()
    thread = long_stream(t, counts)
    engine_of(worker_process(worker)).send_signal(signal.SIGSTOP)  # a step that never ends
    thread.join(BOUND_S)
    assert counts.completed == 1 and counts.failed == counts.hung == counts.internal == 0, counts
    log = t.log(worker)
    assert "sent nothing for" in log and "restarting it: 1 jobs go on" in log, log[-2000:]
    deadline = time.monotonic() + 60
    while counts.completed == 1 and time.monotonic() < deadline:  # the replacement engine serves
        unary(t.base_url, HELLO, counts)
    assert counts.completed == 2, counts


def streamed_text(base_url: str, body: dict, request_id: str, started: threading.Event) -> tuple[str, str, list[str]]:
    """One streamed chat: how it ended ("completed", "error: ..." or "hung"), its text, its error messages."""
    text, errors, outcome = [], [], "hung"
    try:
        with httpx.stream("POST", f"{base_url}/chat/completions", json={**body, "stream": True},
                          headers={"X-Request-Id": request_id}, timeout=BOUND_S) as response:
            if response.status_code != 200:
                return f"status {response.status_code}", response.read().decode(), []
            for line in sse.lines(response):
                if not line.startswith("data: {"):
                    continue
                data = orjson.loads(line[6:])
                if "error" in data:
                    errors.append(data["error"].get("message") or "")
                    outcome = "error"
                    continue
                choice = data["choices"][0] if data["choices"] else {}
                content = choice.get("delta", {}).get("content")
                if content:
                    text.append(content)
                    started.set()  # a token reached the client: the job has streamed
                if choice.get("finish_reason"):
                    outcome = "completed"
    except httpx.TimeoutException:
        outcome = "hung"
    finally:
        started.set()
    return outcome, "".join(text), errors


def holders(t: Tiers, job_ids: list[str]) -> dict[str, list[str]]:
    """The jobs each worker runs now, by the worker's process id (worker ids are host-pid-suffix)."""
    r = t.redis()
    held: dict[str, list[str]] = {}
    for job_id in job_ids:
        worker = r.hget(t.keys.job(job_id, TINY), "worker")
        if worker:
            held.setdefault(worker.decode().rsplit("-", 2)[1], []).append(job_id)
    return held


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_worker_kill_continues_streams(tiers: Callable[..., Tiers], redis_url: str, sig: signal.Signals) -> None:
    """SIGKILL of a worker's I/O process (its engine follows) under 16 streams at temperature 0, with a second
    worker live: that worker continues the dead one's streams from the tokens they had streamed, and every stream
    completes with the text of an uninterrupted run (a unary request with the same body), nothing lost or
    repeated. SIGTERM: the streams the worker could not finish within its grace period are handed over the same
    way."""
    # f32, pinned: the continuing worker's prefill of the streamed ids rounds as the dead one's decoding did only
    # there (in bf16 a near-tie flips and the text goes another way after the takeover point: precision.md).
    t = tiers(tiny(max_num_seqs=16, plugin_config={"INFERENCE_NUM_THREADS": 1, **F32}), OVQ_SHUTDOWN_GRACE_S="1")
    t.api()
    first = t.worker(TINY, name="first")
    t.wait_served(TINY)
    second = t.worker(TINY, name="second")
    t.wait_served(TINY, workers=2)
    bodies = [{"model": TINY, "messages": [{"role": "user", "content": f"Tell me about {i}"}], "max_tokens": 1200,
               "temperature": 0, "ignore_eos": True, "seed": 7} for i in range(16)]
    reference: dict[int, str] = {}

    def unary_text(i: int) -> None:
        response = httpx.post(f"{t.base_url}/chat/completions", json=bodies[i], timeout=BOUND_S)
        assert response.status_code == 200, response.text
        reference[i] = response.json()["choices"][0]["message"]["content"]

    join(in_threads(16, unary_text))
    assert len(reference) == 16 and len(set(reference.values())) > 1
    run = time.time_ns()
    ids = [f"takeover-{run}-{i}" for i in range(16)]
    started = [threading.Event() for _ in range(16)]
    results: dict[int, tuple[str, str, list[str]]] = {}

    def one(i: int) -> None:
        results[i] = streamed_text(t.base_url, bodies[i], ids[i], started[i])

    threads = in_threads(16, one)
    for event in started:
        assert event.wait(60)
    held = holders(t, ids)
    victim = max((first, second), key=lambda proc: len(held.get(str(proc.pid), [])))
    killed = held.get(str(victim.pid), [])
    worker_process(victim).send_signal(sig)
    join(threads)
    survivor = second if victim is first else first
    outcomes = {i: (outcome, errors) for i, (outcome, _, errors) in results.items() if outcome != "completed"}
    assert len(results) == 16 and not outcomes, outcomes
    wrong = [i for i in range(16) if results[i][1] != reference[i]]
    assert not wrong, [(i, ids[i] in killed, len(results[i][1]), len(reference[i])) for i in wrong]
    log = t.log(survivor)
    assert killed and "continuing job" in log, (held, log[-2000:])
    print(f"{sig.name}: the worker running {len(killed)} of 16 streams; {log.count('continuing job')} continued by "
          f"the other; 16 completed, each with its unary answer's text ({sum(map(len, reference.values()))} chars)")
    assert survivor.poll() is None and "Traceback" not in log


# ASCII only: a random-weight model writes bytes that are not UTF-8 into free strings, and such text is not
# continued (workers/engine/residual.py); an enum keeps this one to whole characters.
WORDS = {"type": "object", "properties": {"words": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                   "minItems": 150, "maxItems": 150},
                                         "count": {"type": "integer"}},
         "required": ["words", "count"]}
# A `pattern` only xgrammar compiles: no residual grammar is built for it, so it is not continued.
PATTERNED = {**WORDS, "properties": {**WORDS["properties"], "count": {"type": "string", "pattern": "^[0-9]+$"}}}


@pytest.mark.parametrize("schema", [WORDS, PATTERNED], ids=["continued", "not-continued"])
def test_a_killed_workers_structured_streams_go_on_under_their_grammar(tiers: Callable[..., Tiers],
                                                                        schema: dict) -> None:
    """SIGKILL of the worker holding structured streams (a JSON schema through `response_format`), another worker
    live: it continues them from the text they had streamed, under the grammar of what may follow that text, and
    each stream ends as one instance of the schema that begins with what the client had before the kill. A schema
    whose grammar is not taken apart ends each of those streams with one clean error instead."""
    t = tiers(tiny(max_num_seqs=8, plugin_config={"INFERENCE_NUM_THREADS": 1}))
    t.api()
    first = t.worker(TINY, name="first")
    t.wait_served(TINY)
    second = t.worker(TINY, name="second")
    t.wait_served(TINY, workers=2)
    body = {"model": TINY, "messages": [{"role": "user", "content": "words"}], "max_tokens": 1900, "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "words", "schema": schema}}}
    run = time.time_ns()
    ids = [f"structured-{run}-{i}" for i in range(8)]
    texts: list[list[str]] = [[] for _ in range(8)]
    ends: dict[int, list[str]] = {}
    started = [threading.Event() for _ in range(8)]

    def one(i: int) -> None:
        ends[i] = []
        with httpx.stream("POST", f"{t.base_url}/chat/completions", json=body, headers={"X-Request-Id": ids[i]},
                          timeout=BOUND_S) as response:
            assert response.status_code == 200, response.read()
            for line in sse.lines(response):
                data = orjson.loads(line[6:]) if line.startswith("data: {") else {}
                if "error" in data:
                    ends[i].append(f"error: {data['error'].get('message')}")
                for choice in data.get("choices") or []:
                    if choice["delta"].get("content"):
                        texts[i].append(choice["delta"]["content"])
                        started[i].set()
                    if choice.get("finish_reason"):
                        ends[i].append(choice["finish_reason"])
        started[i].set()

    threads = in_threads(8, one)
    for event in started:
        assert event.wait(60)
    deadline = time.monotonic() + 60
    while min(sum(map(len, text)) for text in texts) < 100 and time.monotonic() < deadline:
        time.sleep(0.01)  # well inside the answers: past the array's opening, into its items
    held = holders(t, ids)
    victim = max((first, second), key=lambda proc: len(held.get(str(proc.pid), [])))
    killed = [ids.index(job) for job in held.get(str(victim.pid), [])]
    before = {i: "".join(texts[i]) for i in killed}  # what each stream's client had when the worker died
    worker_process(victim).kill()
    join(threads)
    assert killed and all(before.values()), before
    if schema is PATTERNED:
        died = ["error: the worker running this job died mid-generation"]
        assert {i: ends.get(i) for i in killed} == {i: died for i in killed}, ends
        return
    assert all(ends.get(i) == ["stop"] for i in range(8)), ends
    for i in range(8):
        jsonschema.validate(json.loads("".join(texts[i])), schema)
    assert all("".join(texts[i]).startswith(before[i]) and len("".join(texts[i])) > len(before[i]) for i in killed)
    log = t.log(second if victim is first else first)
    assert "continuing job" in log, log[-2000:]
    print(f"{len(killed)} of 8 structured streams continued after SIGKILL, at "
          f"{sorted(len(before[i]) for i in killed)} characters; each ended schema-valid")


def test_a_killed_workers_stream_nobody_continues_ends_with_one_error(tiers: Callable[..., Tiers]) -> None:
    """No other worker of the model within OVQ_QUEUE_TIMEOUT_S of the death: one clean error event, no hang."""
    t = tiers(tiny(), OVQ_QUEUE_TIMEOUT_S="3")
    t.api()
    worker = t.worker(TINY)
    t.wait_served(TINY)
    counts = Counts()
    thread = long_stream(t, counts)
    worker_process(worker).kill()
    thread.join(BOUND_S)
    assert counts.failed == 1 and counts.hung == counts.internal == 0, counts
    assert len(counts.errors) == 1 and "no other worker continued it" in counts.errors[0], counts


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    if ON_CLUSTER:
        pytest.skip("stops and restarts one embedded redis-server of its own, never the session's Cluster (a "
                    "Cluster master's death is test_cluster.py's master-kill test)")
    server = EmbeddedRedis(tmp_path / "own-redis", port=free_port(), appendonly=True)
    server.start()
    yield server
    server.stop()


def restart(server: EmbeddedRedis, empty: bool = False, down_s: float = 2.0) -> None:
    server.stop()
    if empty:
        for path in server.data_dir.rglob("*.aof*"):
            path.unlink() if path.is_file() else None
        for path in server.data_dir.glob("appendonlydir"):
            for item in path.iterdir():
                item.unlink()
    time.sleep(down_s)
    server.start()


def test_jobs_queued_across_a_redis_restart_run_after_it_returns(tiers: Callable[..., Tiers],
                                                                   own_redis: EmbeddedRedis) -> None:
    t = tiers(tiny(max_num_seqs=1), url=own_redis.url)
    t.api()
    worker = t.worker(TINY)
    t.wait_served(TINY)
    counts = Counts()
    running = long_stream(t, counts)
    queued = in_threads(3, lambda i: unary(t.base_url, HELLO, counts))
    r = t.redis()
    keys = t.keys
    deadline = time.monotonic() + 30
    while r.xlen(keys.jobs(TINY, "CPU")) < 4:  # the three wait behind the running one
        assert time.monotonic() < deadline
        time.sleep(0.05)
    restart(own_redis)
    running.join(BOUND_S)
    join(queued)
    # The running stream lost its events with the connection: a clean 503. The queued jobs were in the
    # append-only file: they ran once Redis was back.
    assert counts.hung == counts.internal == 0 and counts.completed >= 3, counts
    assert worker.poll() is None and "Traceback" not in t.log(worker)
    unary(t.base_url, HELLO, counts)
    assert counts.completed >= 4, counts


def test_an_empty_redis_after_a_restart_is_set_up_again(tiers: Callable[..., Tiers],
                                                        own_redis: EmbeddedRedis) -> None:
    """Redis comes back without its data: the worker recreates its consumer group (NOGROUP) and its card;
    nobody is restarted by hand."""
    t = tiers(tiny(), url=own_redis.url)
    api = t.api()
    worker = t.worker(TINY)
    t.wait_served(TINY)
    counts = Counts()
    unary(t.base_url, HELLO, counts)
    restart(own_redis, empty=True)
    deadline = time.monotonic() + 60
    while counts.completed < 2 and time.monotonic() < deadline:
        unary(t.base_url, HELLO, counts)
        time.sleep(0.2)
    assert counts.completed == 2 and counts.hung == counts.internal == 0, counts
    assert worker.poll() is None and api.poll() is None
    assert "Traceback" not in t.log(worker) + t.log(api)


def test_killed_redis_clients_just_reconnect(tiers: Callable[..., Tiers], own_redis: EmbeddedRedis) -> None:
    t = tiers(tiny(), url=own_redis.url)
    api = t.api()
    worker = t.worker(TINY)
    t.wait_served(TINY)
    counts = Counts()
    thread = long_stream(t, counts)
    r = t.redis()
    r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    thread.join(BOUND_S)
    deadline = time.monotonic() + 30
    while counts.completed < 2 and time.monotonic() < deadline:
        unary(t.base_url, HELLO, counts)
    assert counts.completed >= 2 and counts.hung == counts.internal == 0, counts
    assert worker.poll() is None and api.poll() is None


def test_while_redis_is_down_the_api_answers_503_and_stays_live(tiers: Callable[..., Tiers],
                                                                own_redis: EmbeddedRedis) -> None:
    t = tiers(tiny(), url=own_redis.url)
    t.api()
    t.worker(TINY)
    t.wait_served(TINY)
    own_redis.stop()
    try:
        base = t.base_url.rsplit("/v3", 1)[0]
        response = httpx.post(f"{t.base_url}/chat/completions", json=HELLO, timeout=30)
        assert response.status_code == 503 and int(response.headers["retry-after"]) > 0
        assert response.json()["error"]["message"]
        assert httpx.get(f"{base}/v2/health/live").status_code == 200
        assert httpx.get(f"{base}/v2/health/ready").status_code == 503
        assert httpx.get(f"{t.base_url}/models").status_code == 503
    finally:
        own_redis.start()
    counts = Counts()
    deadline = time.monotonic() + 60
    while counts.completed == 0 and time.monotonic() < deadline:
        unary(t.base_url, HELLO, counts)
        time.sleep(0.2)
    assert counts.completed == 1, counts


# A request the API cannot take now is refused with one of these (README, "Backpressure": a backlog over
# OVQ_MAX_QUEUE_DEPTH is a 429, Redis or every worker away a 503), each with Retry-After, in the OpenAI envelope.
REFUSALS = (429, 503)
ENVELOPE = {"message", "type", "param", "code"}
BOUNDED_DEPTH = 256  # the bounded API's OVQ_MAX_QUEUE_DEPTH: a 2,000 burst overflows it


def envelope_fault(error: object) -> str | None:
    """Why `error` is not the envelope's `error` object with a message a client can read, or None."""
    if not isinstance(error, dict) or set(error) != ENVELOPE:
        return f"not the error envelope: {error!r:.200}"
    if not isinstance(error["message"], str) or not error["message"].strip():
        return f"no message: {error!r:.200}"
    return None


def refusal_fault(status: int, headers: httpx.Headers, data: bytes) -> str | None:
    """Why a non-200 answer is not a documented refusal, or None."""
    if status not in REFUSALS:
        return f"status {status}: {data[:200]!r}"
    if "retry-after" not in headers:
        return f"status {status} without Retry-After"
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return f"status {status}, not JSON: {data[:200]!r}"
    if not isinstance(body, dict) or set(body) != {"error"}:
        return f"status {status}, not the error envelope: {data[:200]!r}"
    return envelope_fault(body["error"])


def stream_outcome(data: bytes, counts: Counts) -> str:
    """How a 200 stream ended: completed (a finish reason, then [DONE]), failed cleanly (an error event in the
    envelope), internal (an "internal error" event), broken (anything else)."""
    finished, outcome = False, "broken"
    for line in data.split(b"\n"):
        if line.startswith(b"data: {"):
            event = orjson.loads(line[6:])
            if "error" in event:
                fault = envelope_fault(event["error"])
                counts.errors.append(fault or event["error"]["message"])
                return "broken" if fault else "internal" if event["error"]["message"] == "internal error" else "failed"
            finished = finished or any(c.get("finish_reason") for c in event.get("choices") or [])
        elif line.rstrip() == b"data: [DONE]" and finished:
            outcome = "completed"
    return outcome


async def _burst(base: str, n: int, stream: bool) -> Counts:
    counts = Counts()
    body = {**HELLO, "max_tokens": 2, "stream": stream}
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=BOUND_S, limits=limits) as client:

        async def one() -> None:
            try:
                async with client.stream("POST", f"{base}/chat/completions", json=body) as response:
                    data = await response.aread()
            except httpx.TimeoutException:
                counts.add("hung")
                return
            except httpx.HTTPError as exc:  # the server dropped or refused the connection: no answer at all
                counts.errors.append(f"{type(exc).__name__}: {exc}")
                counts.add("broken")
                return
            if response.status_code == 200:
                counts.accepted += 1
                outcome = stream_outcome(data, counts) if stream else "completed"
            elif response.status_code == 500:
                outcome = "internal"
            else:
                fault = refusal_fault(response.status_code, response.headers, data)
                counts.errors.append(fault or f"{response.status_code} {data[:120]!r}")
                outcome = "broken" if fault else "failed"
            counts.add(outcome)

        await asyncio.gather(*(one() for _ in range(n)))
    return counts


@dataclass
class Shared:
    """The tiers the bursts and storms share, and each API's URL and process by the queue depth it allows."""

    tiers: Tiers
    apis: dict[int, tuple[str, subprocess.Popen[bytes]]]


@pytest.fixture(scope="module")
def unharmed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One worker (256 sequences) and two APIs on it, one with the default queue depth and one that allows a backlog
    of BOUNDED_DEPTH: the bursts and storms load them, they do not break them."""
    t = Tiers(redis_url, tmp_path_factory.mktemp("faults"), tiny(max_num_seqs=256))
    apis = {}
    try:
        bounded = t.api(OVQ_MAX_QUEUE_DEPTH=str(BOUNDED_DEPTH))
        t.worker(TINY)
        t.wait_served(TINY)
        apis[BOUNDED_DEPTH] = (t.base_url, bounded)
        default = t.api()  # last: t.base_url is this one's
        t.wait_served(TINY)
        apis[Settings().max_queue_depth] = (t.base_url, default)
        yield Shared(t, apis)
    finally:
        t.stop()


def wait_for_empty_stream(t: Tiers) -> None:
    r = t.redis()
    stream_key = t.keys.jobs(TINY, "CPU")
    deadline = time.monotonic() + BOUND_S
    while r.xlen(stream_key) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.xlen(stream_key) == 0, "an earlier test's jobs are still in the stream"


@pytest.mark.parametrize(("n", "stream", "bounded"), [(1000, False, False), (2000, True, False), (2000, True, True)],
                         ids=["1000-unary", "2000-streams", "2000-streams-bounded-queue"])
def test_a_burst_never_gives_a_500(unharmed: Shared, n: int, stream: bool, bounded: bool) -> None:
    """Every request of a burst at once is answered, or refused as documented (429/503, Retry-After, the OpenAI
    envelope); never a 500, a hang, or a dropped connection. The queue admits a request while the stream's backlog
    is under the API's OVQ_MAX_QUEUE_DEPTH, and nothing here fails an admitted job (no deadline, no key or quota,
    OVQ_QUEUE_TIMEOUT_S 300 s): the first `depth` requests to reach an empty stream are admitted and complete."""
    depth = BOUNDED_DEPTH if bounded else Settings().max_queue_depth
    url, api = unharmed.apis[depth]
    wait_for_empty_stream(unharmed.tiers)
    counts = asyncio.run(_burst(url, n, stream))
    assert counts.internal == counts.hung == counts.broken == 0, counts
    assert counts.completed + counts.failed == n, counts
    assert counts.completed >= min(n, depth), f"fewer completed than the queue admits: {counts}"
    assert "Traceback" not in unharmed.tiers.log(api)


def test_a_disconnect_storm_is_fully_cancelled(unharmed: Shared) -> None:
    """200 streams whose clients leave after their first line: every job ends cancelled (its hash says so), none
    runs its 1,900 tokens to the end, and none is left in the stream."""
    t = unharmed.tiers
    body = {"model": TINY, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1900, "ignore_eos": True,
            "stream": True}
    ids = [f"storm-{time.time_ns()}-{i}" for i in range(200)]

    async def storm() -> None:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as client:
            async def one(request_id: str) -> None:
                async with client.stream("POST", f"{t.base_url}/chat/completions", json=body,
                                         headers={"X-Request-Id": request_id}) as response:
                    assert response.status_code == 200
                    async for _ in response.aiter_lines():
                        return  # gone after the first line
            await asyncio.gather(*(one(i) for i in ids))

    asyncio.run(storm())
    r = t.redis()
    stream_key = t.keys.jobs(TINY, "CPU")
    ended = (JobStatus.DONE, JobStatus.ERROR, JobStatus.CANCELLED)

    def statuses() -> Counter[str]:
        return Counter((r.hget(t.keys.job(i, TINY), JobHash.STATUS) or b"none").decode() for i in ids)

    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and (r.xlen(stream_key) or r.xpending(stream_key, GROUP)["pending"]
                                           or sum(statuses()[s] for s in ended) < len(ids)):
        time.sleep(0.1)
    assert statuses() == {JobStatus.CANCELLED: len(ids)}, f"jobs of departed clients ended {dict(statuses())}"
    assert r.xlen(stream_key) == 0, "jobs of departed clients were left in the stream"


def test_a_vision_model_answers_a_text_only_chat(stack: object) -> None:
    base = stack.base_url  # type: ignore[attr-defined]
    counts = Counts()
    threads = in_threads(4, lambda i: unary(base, {"model": "tiny-llava", "messages": [
        {"role": "user", "content": f"hi {i}"}], "max_tokens": 4}, counts))
    join(threads)
    assert counts.completed == 4, counts
