"""The Batch API end to end: the official SDK against real API processes, real workers (the tiny model: content
does not matter here) and real rq batch workers (`ovq batch-worker`) on the session's Redis."""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai import OpenAI
from openai.types import Batch

from common.keys import Keys
from common.redis.client import sync_client
from tests.conftest import MODELS, ON_CLUSTER, ROOT, Tiers

pytestmark = pytest.mark.e2e

TINY = "tiny-llama"
ENDED = ("completed", "failed", "expired", "cancelled")
# Short leases and sweeps so a dead batch worker's batch is taken over within seconds; a 3 s window to expire.
BATCH_ENV = {"OVQ_BATCH_LEASE_S": "2", "OVQ_BATCH_SWEEP_S": "0.5", "OVQ_BATCH_MAX_IN_FLIGHT": "4",
             "OVQ_BATCH_COMPLETION_WINDOWS": '["24h", "3s"]', "OVQ_BATCH_MAX_REQUESTS": "400",
             "OVQ_BATCH_MAX_INPUT_BYTES": "200000", "OVQ_SHUTDOWN_GRACE_S": "10"}


def tiny(max_num_seqs: int) -> dict[str, dict]:
    return {TINY: {"path": str(MODELS / TINY), "cache_size": 0, "max_num_seqs": max_num_seqs}}


def line(i: int, endpoint: str = "/v1/chat/completions", model: str = TINY, **body: Any) -> dict[str, Any]:
    if endpoint.endswith("/responses"):
        request = {"model": model, "input": f"Count to {i}", "max_output_tokens": 16}
    elif endpoint.endswith("/chat/completions"):
        request = {"model": model, "messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": 4}
    else:
        request = {"model": model, "prompt": f"Count to {i}", "max_tokens": 4}
    return {"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": {**request, **body}}


def jsonl(lines: list[Any]) -> bytes:
    return b"\n".join(x if isinstance(x, bytes) else orjson.dumps(x) for x in lines) + b"\n"


def upload(client: OpenAI, lines: list[Any]) -> str:
    return client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id


def start(client: OpenAI, lines: list[Any], endpoint: str = "/v1/chat/completions", window: str = "24h") -> Batch:
    return client.batches.create(input_file_id=upload(client, lines), endpoint=endpoint,  # type: ignore[arg-type]
                                 completion_window=window)  # type: ignore[arg-type]


def wait(client: OpenAI, batch_id: str, until: Any = ENDED, timeout: float = 90) -> Batch:
    """Poll until the batch's status is one of `until` (a tuple) or `until(batch)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if (batch.status in until) if isinstance(until, tuple) else until(batch):
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch stuck: {batch}")
        time.sleep(0.2)


def results(client: OpenAI, batch: Batch) -> tuple[list[dict], list[dict]]:
    def read(file_id: str | None) -> list[dict]:
        # Lines end with \n only: str.splitlines() would also split at U+2028 inside a generated string.
        content = client.files.content(file_id).content if file_id else b""
        return [orjson.loads(x) for x in content.split(b"\n") if x]
    return read(batch.output_file_id), read(batch.error_file_id)


def answered_once(outputs: list[dict], errors: list[dict], expected: list[str]) -> None:
    """Every custom_id answered exactly once across the output and error files, nothing else."""
    ids = [x["custom_id"] for x in outputs + errors]
    assert sorted(ids) == sorted(expected), "a line answered twice, or never"


def client_for(t: Tiers, prefix: str = "/v1", port: int | None = None) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{port or t.port}{prefix}", api_key="unused", max_retries=0, timeout=30)


def batch_worker(t: Tiers, name: str, port: int | None = None, **env: str) -> subprocess.Popen[bytes]:
    return t.start("batch-worker", "--api-url", f"http://127.0.0.1:{port or t.port}", "--name", name, name=name,
                   **env)


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    """One API, one tiny worker taking one job at a time (queue order is observable), one batch worker."""
    t = Tiers(redis_url, tmp_path_factory.mktemp("batch"), tiny(1), **BATCH_ENV)
    t.worker_pid = t.worker(TINY).pid  # type: ignore[attr-defined]
    t.api()
    t.wait_served(TINY)
    batch_worker(t, "bw")
    yield t
    t.stop()


def test_fifty_lines_through_the_sdk_on_v1_and_v3(stack: Tiers) -> None:
    for prefix, endpoint, kind in (("/v1", "/v1/chat/completions", "chat.completion"),
                                   ("/v3", "/v1/completions", "text_completion")):
        client = client_for(stack, prefix)
        lines = [line(i, endpoint) for i in range(50)]
        data = jsonl(lines)
        uploaded = client.files.create(file=("fifty.jsonl", io.BytesIO(data)), purpose="batch")
        assert (uploaded.purpose, uploaded.bytes, uploaded.filename) == ("batch", len(data), "fifty.jsonl")
        assert uploaded.expires_at is not None and uploaded.expires_at - uploaded.created_at == 30 * 24 * 3600
        assert client.files.retrieve(uploaded.id) == uploaded
        assert client.files.content(uploaded.id).content == data
        created = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                        completion_window="24h", metadata={"run": prefix})
        assert (created.status, created.endpoint, created.metadata) == ("validating", endpoint, {"run": prefix})
        assert created.expires_at == created.created_at + 24 * 3600
        batch = wait(client, created.id)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (50, 50, 0)
        assert batch.model == TINY and batch.error_file_id is None and batch.errors is None
        assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
        assert batch.usage is not None and 0 < batch.usage.output_tokens <= 50 * 4
        outputs, errors = results(client, batch)
        assert [o["custom_id"] for o in outputs] == [f"req-{i}" for i in range(50)] and errors == []
        for output in outputs:
            assert output["id"].startswith("batch_req_") and output["error"] is None
            assert output["response"]["status_code"] == 200
            assert (output["response"]["body"]["object"], output["response"]["body"]["model"]) == (kind, TINY)
        assert created.id in [b.id for b in client.batches.list()]
        output_file = client.files.retrieve(batch.output_file_id)  # type: ignore[arg-type]
        assert output_file.purpose == "batch_output"
        assert output_file.id in [f.id for f in client.files.list(purpose="batch_output")]
        assert uploaded.id not in [f.id for f in client.files.list(purpose="batch_output")]
        assert client.files.delete(uploaded.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            client.files.content(uploaded.id)
        assert uploaded.id not in [f.id for f in client.files.list()]
    metrics = httpx.get(f"http://127.0.0.1:{stack.port}/metrics").text
    assert f'ovq_batch_lines_total{{model="{TINY}",outcome="completed"}} 100.0' in metrics
    # The ops page shows the same, from Redis.
    (shown,) = [b for b in httpx.get(f"http://127.0.0.1:{stack.port}/ops/data").json()["batches"] if b["model"] == TINY]
    assert (shown["completed"], shown["in_flight"], shown["batches"]) == (100, 0, {})
    panel = httpx.get(f"http://127.0.0.1:{stack.port}/ops/panel").text
    assert f'<tr data-batches="{TINY}">' in panel and '<td class="n" data-k="batch-completed">100</td>' in panel


def test_bad_files_fail_the_batch_in_validating_naming_the_line(stack: Tiers) -> None:
    client = client_for(stack)
    lines = [line(0), b"{not json", line(0), line(2, "/v1/completions"), line(3, model="another-model"),
             {"custom_id": "req-5", "method": "GET", "url": "/v1/chat/completions", "body": {"model": TINY}}, line(6)]
    batch = wait(client, start(client, lines).id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors is not None and batch.errors.data is not None
    found = [(e.code, e.line) for e in batch.errors.data]
    assert found == [("invalid_json_line", 2), ("duplicate_custom_id", 3), ("url_mismatch", 4),
                     ("model_mismatch", 5), ("invalid_request", 6)]
    unknown = wait(client, start(client, [line(0, model="no-such-model"), line(1, model="no-such-model")]).id)
    assert unknown.status == "failed" and unknown.errors and unknown.errors.data
    assert [(e.code, e.line, e.param) for e in unknown.errors.data] == [("model_not_found", 1, "body.model")]
    too_many = wait(client, start(client, [line(i) for i in range(401)]).id)
    assert too_many.errors and too_many.errors.data and too_many.errors.data[0].code == "too_many_tasks"
    too_big = wait(client, start(client, [line(0, messages=[{"role": "user", "content": "x" * 210_000}])]).id)
    assert too_big.errors and too_big.errors.data and too_big.errors.data[0].code == "file_too_large"
    empty = wait(client, start(client, [b""]).id)
    assert empty.errors and empty.errors.data and empty.errors.data[0].code == "empty_file"


def test_refused_at_create(stack: Tiers) -> None:
    client = client_for(stack)
    file_id = upload(client, [line(0)])
    bad = [dict(endpoint="/v1/images/generations", completion_window="24h"),
           dict(endpoint="/v1/chat/completions", completion_window="48h"),
           dict(endpoint="/v1/chat/completions", completion_window="24h",
                metadata={f"k{i}": "v" for i in range(17)})]
    for args in bad:
        with pytest.raises(openai.BadRequestError) as caught:
            client.batches.create(input_file_id=file_id, **args)  # type: ignore[arg-type]
        assert caught.value.body["param"] in ("endpoint", "completion_window", "metadata")  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_a_line_failing_the_endpoints_checks_is_an_error_line(stack: Tiers) -> None:
    client = client_for(stack)
    bad = {"req-1": {"max_tokens": -1}, "req-3": {"messages": "hello"}, "req-5": {"stream": True},
           "req-7": {"temperature": 9}}
    lines = [line(i, **bad.get(f"req-{i}", {})) for i in range(9)]
    batch = wait(client, start(client, lines).id)
    assert batch.status == "completed"
    assert batch.request_counts and (batch.request_counts.completed, batch.request_counts.failed) == (5, 4)
    outputs, errors = results(client, batch)
    assert [o["custom_id"] for o in outputs] == ["req-0", "req-2", "req-4", "req-6", "req-8"]
    assert [e["custom_id"] for e in errors] == ["req-1", "req-3", "req-5", "req-7"]
    assert all(e["response"]["status_code"] == 400 and e["error"] is None for e in errors)
    # The error line's body is the live endpoint's own answer to the same request.
    with pytest.raises(openai.BadRequestError) as live:
        client.chat.completions.create(**lines[1]["body"])
    assert errors[0]["response"]["body"] == {"error": live.value.body}


def test_cancel_lets_lines_in_flight_finish_and_writes_what_was_done(stack: Tiers) -> None:
    client = client_for(stack)
    created = start(client, [line(i, max_tokens=32) for i in range(200)])
    wait(client, created.id, lambda b: b.request_counts and b.request_counts.completed >= 4)
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert client.batches.cancel(created.id).status == "cancelled"
    outputs, errors = results(client, batch)
    assert batch.request_counts and 4 <= batch.request_counts.completed == len(outputs) < 200
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"} and all(e["response"] is None for e in errors)
    answered_once(outputs, errors, [f"req-{i}" for i in range(200)])
    done = wait(client, start(client, [line(0)]).id)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)


def test_completion_window_elapsed_ends_expired_with_what_was_done(stack: Tiers) -> None:
    client = client_for(stack)
    created = start(client, [line(i, max_tokens=32) for i in range(300)], window="3s")
    batch = wait(client, created.id)
    assert batch.status == "expired" and batch.expired_at
    outputs, errors = results(client, batch)
    assert batch.request_counts and 0 < len(outputs) == batch.request_counts.completed < 300
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    answered_once(outputs, errors, [f"req-{i}" for i in range(300)])


def test_interactive_requests_never_wait_behind_batch_lines(stack: Tiers) -> None:
    """The worker takes one job at a time and the batch keeps 4 lines queued. With the worker's I/O process paused,
    an interactive request joins the queue behind waiting batch lines; resumed, the worker takes the request before
    every one of them (the order read from the `taken` times the worker writes in each job's hash)."""
    client = client_for(stack)
    r, keys = stack.redis(), stack.keys
    interactive_stream, batch_stream = keys.jobs(TINY, "CPU"), keys.batch_jobs(TINY, "CPU")
    created = start(client, [line(i, max_tokens=24) for i in range(60)])
    wait(client, created.id, lambda b: b.request_counts and b.request_counts.completed >= 2)
    checked: list[tuple[str, list[str]]] = []
    with ThreadPoolExecutor(1) as pool:
        for i in range(3):
            os.kill(stack.worker_pid, signal.SIGSTOP)
            try:
                answer = pool.submit(client.chat.completions.create, model=TINY, max_tokens=2,
                                     messages=[{"role": "user", "content": f"quick {i}"}])
                deadline = time.monotonic() + 2
                while not (queued := r.xrange(interactive_stream)) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert queued, "the interactive request did not reach the stream"
                arrived = queued[0][0]
                pending = {p["message_id"] for p in r.xpending_range(batch_stream, "workers", "-", "+", 100)}
                waiting = [orjson.loads(fields[b"job"])["id"] for entry, fields in r.xrange(batch_stream)
                           if entry not in pending and _entry_key(entry) < _entry_key(arrived)]
            finally:
                os.kill(stack.worker_pid, signal.SIGCONT)
            job = answer.result(timeout=30).id.removeprefix("chatcmpl-")
            checked.append((job, waiting))
    client.batches.cancel(created.id)
    wait(client, created.id)  # every line queued has been taken by now (a cancel lets lines in flight finish)
    for job, waiting in checked:
        assert waiting, "no batch line was waiting: the test proves nothing"
        taken = float(r.hget(keys.job(job, TINY), "taken"))
        lines = [float(r.hget(keys.job(line_job, TINY), "taken")) for line_job in waiting]
        assert all(line_taken > taken for line_taken in lines), "an interactive request waited behind a batch line"


def _entry_key(entry: bytes) -> tuple[int, int]:
    ms, seq = entry.split(b"-")
    return int(ms), int(seq)


def test_sigkill_of_a_batch_worker_mid_batch_answers_every_line_once(tiers, tmp_path: Path) -> None:
    t: Tiers = tiers(tiny(2), **BATCH_ENV)
    t.worker(TINY)
    t.api()
    t.wait_served(TINY)
    first = batch_worker(t, "bw-killed")
    client = client_for(t)
    expected = [f"req-{i}" for i in range(150)]
    # Long enough lines that the second runner cannot finish the batch before it hears its SIGTERM (its heartbeat
    # polls for the shutdown every ~0.7 s here): a faster serving path finished 16-token lines in that time.
    created = start(client, [line(i, max_tokens=48, ignore_eos=True) for i in range(150)])
    before = wait(client, created.id, lambda b: b.request_counts and b.request_counts.completed >= 20)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    at_kill = client.batches.retrieve(created.id)
    assert at_kill.status == "in_progress" and at_kill.request_counts and at_kill.request_counts.completed < 150
    second = batch_worker(t, "bw-drained")
    more = before.request_counts.completed + 20  # type: ignore[union-attr]
    wait(client, created.id, lambda b: b.request_counts and b.request_counts.completed >= more)
    second.send_signal(signal.SIGTERM)  # drains: lines in flight finish, the batch goes back on the queue
    assert second.wait(30) == 0
    handed_back = client.batches.retrieve(created.id)
    assert handed_back.status == "in_progress", handed_back
    batch_worker(t, "bw-last")
    batch = wait(client, created.id)
    assert batch.status == "completed", batch
    outputs, errors = results(client, batch)
    assert errors == [] and [o["custom_id"] for o in outputs] == expected
    assert batch.request_counts and batch.request_counts.completed == 150
    r, keys = t.redis(), t.keys
    assert not r.exists(keys.batch_done(created.id), keys.batch_lease(created.id))
    assert "handed back" in t.log(second) or "worker stopping" in t.log(second)


@pytest.mark.skipif(ON_CLUSTER, reason="a plain `rq worker --url` speaks to one Redis: on a Cluster only "
                                       "`ovq batch-worker` (rq on the master of the Batch API's slot) runs batches")
def test_two_apis_and_two_batch_workers_share_one_redis(tiers) -> None:
    """`ovq batch-worker` on one API, a plain `rq worker` on ovq's queue on the other: each runs a batch."""
    t: Tiers = tiers(tiny(4), **BATCH_ENV)
    t.worker(TINY)
    t.api()
    first_port = t.port
    t.wait_served(TINY)
    t.api()
    t.wait_served(TINY)
    one, two = client_for(t, port=first_port), client_for(t)
    batch_worker(t, "bw-one", port=first_port)
    plain = subprocess.Popen([sys.executable, "-m", "rq.cli", "worker", "--url", t.redis_url, "--name", "rq-plain",
                              Keys(t.prefix).batch_queue], cwd=ROOT, stdout=(t.work / "rq-plain.log").open("wb"),
                             stderr=subprocess.STDOUT, env={**t.env, "OVQ_BATCH_API_URL": f"http://127.0.0.1:{t.port}",
                                                            "RQ_KEY_PREFIX": Keys(t.prefix).rq_prefix})
    t.procs.append(plain)
    t.logs[plain.pid] = t.work / "rq-plain.log"
    a = start(one, [line(i, max_tokens=16) for i in range(80)])
    b = start(two, [line(i, "/v1/completions", max_tokens=16) for i in range(80)], endpoint="/v1/completions")
    done = [wait(two, a.id), wait(one, b.id)]
    assert [d.status for d in done] == ["completed", "completed"]
    for batch, client in zip(done, (one, two), strict=True):
        outputs, errors = results(client, batch)
        assert errors == [] and [o["custom_id"] for o in outputs] == [f"req-{i}" for i in range(80)]
    r, keys = t.redis(), t.keys
    workers = {r.hget(f"{keys.rq_prefix}:job:{r.hget(keys.batch(d.id), 'rq_job').decode()}", "worker_name").decode()
               for d in done}
    assert workers == {"bw-one", "rq-plain"}
    assert {b.id for b in one.batches.list()} == {b.id for b in two.batches.list()} >= {a.id, b.id}


def test_a_key_prefix_rq_cannot_use_refuses_batches_with_the_reason(tiers) -> None:
    """rq splices its key prefix into Lua: with OVQ_KEY_PREFIX `two words` batches are refused, saying why,
    before any batch is stored."""
    t: Tiers = tiers(tiny(1))
    t.api(OVQ_KEY_PREFIX="two words")
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{t.port}/health", timeout=2).status_code < 500:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, t.log(t.procs[-1])
        time.sleep(0.2)
    client = client_for(t)
    file_id = upload(client, [line(0)])
    with pytest.raises(openai.InternalServerError) as caught:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "OVQ_KEY_PREFIX 'two words' cannot name rq's keys" in caught.value.body["message"]  # type: ignore[index]
    assert client.batches.list().data == []


# rq's keys a deployment may keep without a TTL, each with an owner that trims it (common/keys.py, Keys.rq_prefix).
RQ_KEYS_OWNED = ("queue:", "queues", "workers", "wip:", "finished:", "failed:", "deferred:", "scheduled:",
                 "canceled:")


def test_two_deployments_on_one_redis_keep_their_rq_keys_apart(tiers, redis_url: str) -> None:
    """Two OVQ_KEY_PREFIXes, each with its API, worker and a batch worker named alike: each runs its batch, and
    every key either made is under its own prefix, rq's included; none is rq's default `rq:*`."""
    r = sync_client(redis_url)
    before = set(r.scan_iter(match="*", count=1000))
    deployments = []
    for label in ("a", "b"):
        t: Tiers = tiers(tiny(2), **BATCH_ENV)
        t.worker(TINY, name=f"worker-{label}")
        t.api()
        deployments.append(t)
    for t, label in zip(deployments, "ab", strict=True):
        t.wait_served(TINY)
        # The same rq worker name in both: rq:worker:bw was one key for both deployments before.
        t.start("batch-worker", "--api-url", f"http://127.0.0.1:{t.port}", "--name", "bw", name=f"bw-{label}")
    clients = [client_for(t) for t in deployments]
    created = [start(c, [line(i) for i in range(10)]) for c in clients]
    done = [wait(c, b.id) for c, b in zip(clients, created, strict=True)]
    assert [d.status for d in done] == ["completed", "completed"], done
    made = {k.decode() for k in set(r.scan_iter(match="*", count=1000)) - before}
    assert not [k for k in made if k.startswith("rq:")], "a key under rq's default prefix"
    # Other tests' tiers still running (the module's `stack`) write under their own `ovqt…` prefixes.
    assert not [k for k in made if not re.match(r"ovqt\d+:", k)], "a key under no deployment's prefix"
    for t, other, batch in zip(deployments, reversed(deployments), done, strict=True):
        keys, rq_job = t.keys, r.hget(t.keys.batch(batch.id), "rq_job").decode()
        own = {k for k in made if k.startswith(f"{keys.rq_prefix}:")}
        assert r.smembers(f"{keys.rq_prefix}:queues") == {f"{keys.rq_prefix}:queue:{keys.batch_queue}".encode()}
        assert f"{keys.rq_prefix}:job:{rq_job}" in own and f"{keys.rq_prefix}:worker:bw" in own
        assert r.smembers(f"{keys.rq_prefix}:workers") == {f"{keys.rq_prefix}:worker:bw".encode()}
        assert not [k for k in made if rq_job in k and not k.startswith(f"{keys.rq_prefix}:")]
        assert not [k for k in made if batch.id in k and not k.startswith(f"{t.prefix}:")]
        assert r.hget(f"{keys.rq_prefix}:job:{rq_job}", "status") == b"finished"
        assert 0 < r.ttl(f"{keys.rq_prefix}:job:{rq_job}") <= 24 * 3600  # result_ttl: set by ovq at enqueue
        lasting = [k for k in own if r.ttl(k) == -1]
        assert not [k for k in lasting if not k[len(keys.rq_prefix) + 1:].startswith(RQ_KEYS_OWNED)], lasting
        assert not [k for k in own if f"{other.prefix}:" in k or f"{other.prefix}-" in k]


def test_responses_lines_are_answered_as_the_responses_api_answers(stack: Tiers) -> None:
    client = client_for(stack)
    lines = [line(i, "/v1/responses") for i in range(3)] + [line(3, "/v1/responses", background=True)]
    batch = wait(client, start(client, lines, "/v1/responses").id)
    assert batch.status == "completed", batch
    outputs, errors = results(client, batch)
    answered = {o["custom_id"]: o["response"] for o in outputs + errors}
    for i in range(3):
        body = answered[f"req-{i}"]["body"]
        assert answered[f"req-{i}"]["status_code"] == 200, body
        assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
    assert answered["req-3"]["status_code"] == 400 and "background" in answered["req-3"]["body"]["error"]["message"]
    assert batch.usage is not None and batch.usage.output_tokens > 0
