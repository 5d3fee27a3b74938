"""`ovq status`, `ovq jobs show`, `ovq dead ...` and `ovq worker drain` against a real Redis holding what workers
and API processes write (each test under a key prefix of its own)."""
from __future__ import annotations

import json
import time

import orjson
import pytest
import redis

from cli.main import main
from common.jobs import Job, SamplingParams
from common.keys import GROUP, Keys
from common.ops.control import RETRY_REPLY_TO


@pytest.fixture()
def keys(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Keys:
    prefix = f"cli{time.monotonic_ns()}"
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("OVQ_KEY_PREFIX", prefix)
    return Keys(prefix)


def announce_worker(r: redis.Redis, keys: Keys, worker: str, model: str = "m", running: int = 1) -> None:
    now = time.time()
    r.hset(keys.worker(worker), mapping={"model": model, "device": "CPU", "servable_type": "LM_CB", "capacity": 4,
                                         "running": running, "heartbeat": now, "host": "h1", "pid": 42,
                                         "kv_cache_usage": 0.25, "tokens_per_s": 12.5, "draining": 0})
    r.expire(keys.worker(worker), 30)
    r.zadd(keys.workers(model, "CPU"), {worker: now})
    r.hset(keys.model(model), "CPU", "{}")
    r.zadd(keys.models, {model: now})


def queue(r: redis.Redis, keys: Keys, model: str = "m", n: int = 1, take: int = 0, consumer: str = "w1") -> list[Job]:
    """`n` jobs on the stream, the first `take` of them delivered to `consumer` (in flight)."""
    stream = keys.jobs(model, "CPU")
    try:
        r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError:
        pass
    jobs = [Job(model=model, device="CPU", kind="chat", prompt="hi", params=SamplingParams(max_tokens=4),
                reply_to="api-x") for _ in range(n)]
    for job in jobs:
        r.xadd(stream, job.to_fields())
        r.hset(keys.job(job.id), mapping={"status": "queued", "created": job.created, "model": model, "device": "CPU",
                                          "api": job.reply_to})
    if take:
        r.xreadgroup(GROUP, consumer, {stream: ">"}, count=take)
    return jobs


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_shows_streams_workers_and_dead_letters(keys: Keys, redis_client: redis.Redis,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    announce_worker(redis_client, keys, "w1")
    queue(redis_client, keys, n=5, take=2)
    redis_client.xadd(keys.dead, {"job": b"not a job", "reason": b"unreadable"})
    redis_client.hset(keys.stats("m", "CPU", int(time.time() // 10 * 10)), mapping={"tokens": 30, "done": 2})
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0
    data = json.loads(out)
    [stream] = data["streams"]
    assert (stream["model"], stream["waiting"], stream["in_flight"], stream["workers"], stream["consumers"]) == \
        ("m", 3, 2, 1, 1)
    assert stream["stats"]["tokens"] == 30 and stream["stats"]["done"] == 2
    [worker] = data["workers"]
    assert (worker["id"], worker["host"], worker["capacity"], worker["running"], worker["kv_cache_usage"]) == \
        ("w1", "h1", 4, 1, 0.25)
    assert data["dead_letters"] == 1
    code, out, _ = run(capsys, "status")
    assert code == 0
    assert keys.jobs("m", "CPU") in out and "w1" in out and "dead letters: 1" in out


def test_status_says_when_nothing_is_served_and_when_redis_is_away(keys: Keys, redis_url: str,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(capsys, "status")
    assert code == 0 and "No model announced" in out
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1")
    code, _, err = run(capsys, "status")
    assert code == 1 and "unreachable" in err and "Traceback" not in err


def test_jobs_show_tells_where_a_job_is_and_how_it_went(keys: Keys, redis_client: redis.Redis,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    [held] = queue(redis_client, keys, n=1, take=1, consumer="w9")
    code, out, _ = run(capsys, "jobs", "show", held.id, "--json")
    info = json.loads(out)
    assert code == 0
    assert (info["status"], info["model"], info["device"], info["worker"], info["deliveries"], info["kind"]) == \
        ("queued", "m", "CPU", "w9", 1, "chat")
    assert info["api"] == "api-x" and info["api_alive"] is None  # that API never announced itself
    done = "j-done"
    redis_client.hset(keys.job(done), mapping={
        "status": "error", "created": time.time(), "model": "m", "device": "CPU", "worker": "w1", "api": "api-y",
        "prompt_tokens": 5, "completion_tokens": 3, "queue_ms": 1.5, "ttft_ms": 12.0, "total_ms": 40.0,
        "error": orjson.dumps({"message": "the engine broke", "type": "server_error"})})
    redis_client.zadd(keys.apis, {"api-y": time.time()})
    code, out, _ = run(capsys, "jobs", "show", done)
    assert code == 0
    for expected in ("error", "w1", "api-y (alive)", "12.0 ms", "40.0 ms", "server_error: the engine broke"):
        assert expected in out
    code, _, err = run(capsys, "jobs", "show", "nope")
    assert code == 1 and "no job 'nope'" in err


def test_dead_letters_are_listed_retried_and_purged(keys: Keys, redis_client: redis.Redis,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    stream = keys.jobs("m", "CPU")
    job = Job(model="m", device="CPU", kind="completion", prompt="x", reply_to="api-gone", created=1.0)
    redis_client.hset(keys.job(job.id), mapping={"status": "error", "streamed": 1, "error": "{}"})
    letter = redis_client.xadd(keys.dead, {**job.to_fields(), "reason": "delivered too often", "worker": "w3"})
    unreadable = redis_client.xadd(keys.dead, {"job": b"{", "reason": b"unreadable"})
    code, out, _ = run(capsys, "dead", "list", "--json")
    listed = json.loads(out)
    assert code == 0 and listed["total"] == 2
    assert [d["job"] for d in listed["dead"]] == ["", job.id]  # newest first; the unreadable one has no job id
    assert listed["dead"][1]["reason"] == "delivered too often" and listed["dead"][1]["worker"] == "w3"
    code, out, _ = run(capsys, "dead", "list")
    assert code == 0 and job.id in out and "delivered too often" in out

    code, out, _ = run(capsys, "dead", "retry", letter.decode())
    assert code == 0 and f"job {job.id} queued again" in out
    [(_, fields)] = redis_client.xrange(stream)
    again = Job.from_fields(fields)
    assert again.id == job.id and again.reply_to == RETRY_REPLY_TO and again.created > 1.0
    record = redis_client.hgetall(keys.job(job.id))
    assert record[b"status"] == b"queued" and b"streamed" not in record and b"error" not in record
    assert record[b"retries"] == b"1" and redis_client.ttl(keys.job(job.id)) > 0
    code, _, err = run(capsys, "dead", "retry", letter.decode())
    assert code == 1 and "no dead letter" in err  # once only
    code, _, err = run(capsys, "dead", "retry", unreadable.decode())
    assert code == 1 and "cannot read" in err

    code, out, _ = run(capsys, "dead", "purge")
    assert code == 0 and "purged 1 dead letters" in out
    assert not redis_client.exists(keys.dead)


def test_worker_drain_asks_a_live_worker_only(keys: Keys, redis_client: redis.Redis,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    announce_worker(redis_client, keys, "w1")
    code, out, _ = run(capsys, "worker", "drain", "w1")
    assert code == 0 and "drain requested" in out
    assert redis_client.exists(keys.drain("w1")) and 0 < redis_client.ttl(keys.drain("w1")) <= 600
    code, out, _ = run(capsys, "status", "--json")
    assert json.loads(out)["workers"][0]["drain_requested"] is True
    code, _, err = run(capsys, "worker", "drain", "w-unknown")
    assert code == 1 and "no live worker" in err
    assert not redis_client.exists(keys.drain("w-unknown"))
