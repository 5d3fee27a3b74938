"""A batch's record in Redis (Lua on the real redis-server): the lease, exactly-once answers, cancel, the end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import redis
import redis.asyncio as aioredis

from common.batch.store import Batches, BatchState, result_file_id, window_seconds
from common.keys import Keys
from common.owner import OPERATOR, Caller
from common.settings import Settings
from tests.conftest import ROOT


@pytest.fixture()
async def batches(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    yield Batches(redis, Keys(f"batches{time.time_ns()}"), Settings(batch_lease_s=5))
    await redis.aclose()


def state(batch_id: str = "batch_1") -> BatchState:
    now = int(time.time())
    return BatchState(id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
                      created_at=now, expires_at=now + 86400, metadata={"a": "b"}, model="m")


async def test_the_record_round_trips_and_lists_newest_first(batches: Batches) -> None:
    now = int(time.time())
    for i in range(3):
        await batches.create(state(f"batch_{i}").model_copy(update={"created_at": now + i}))
    assert (await batches.get("batch_1", OPERATOR)) == state("batch_1").model_copy(update={"created_at": now + 1})
    page, more = await batches.page(None, 2, OPERATOR)
    assert [s.id for s in page] == ["batch_2", "batch_1"] and more
    page, more = await batches.page("batch_1", 2, OPERATOR)
    assert [s.id for s in page] == ["batch_0"] and not more
    assert 0 < await batches.redis.ttl(batches.keys.batch("batch_1"))


async def test_one_runner_holds_the_lease_and_only_it_writes(batches: Batches) -> None:
    await batches.create(state())
    assert await batches.acquire("batch_1", "a")
    assert not await batches.acquire("batch_1", "b")
    assert await batches.renew("batch_1", "a") and not await batches.renew("batch_1", "b")
    assert await batches.update("batch_1", "b", ("validating",), status="in_progress") == ""
    assert await batches.update("batch_1", "a", ("validating",), status="in_progress", total=3) == "in_progress"
    assert await batches.update("batch_1", "a", ("validating",), status="failed") == "in_progress"
    s = state()
    assert await batches.record(s, "a", "x", b'{"n": 1}', True, 5, 7) == 1
    assert await batches.record(s, "a", "x", b'{"n": 2}', False, 5, 7) == 0  # answered once, whoever asks again
    assert await batches.record(s, "b", "y", b"{}", True, 1, 1) == -1  # not the lease holder: nothing written
    assert await batches.lines("batch_1", ["x", "y"]) == [b'{"n": 1}', None]
    assert 0 < await batches.redis.ttl(batches.keys.batch_done("batch_1"))  # the batch's own TTL
    got = await batches.get("batch_1", OPERATOR)
    assert got and (got.total, got.completed, got.failed, got.input_tokens, got.output_tokens) == (3, 1, 0, 5, 7)
    counters = await batches.redis.hgetall(batches.keys.batch_stats("m"))
    assert counters == {b"completed": b"1"}
    await batches.release("batch_1", "b")
    assert not await batches.acquire("batch_1", "c")  # only the holder releases
    assert await batches.end("batch_1", "a", "completed", completed_at=1, output_file_id="file-o")
    got = await batches.get("batch_1", OPERATOR)
    assert got and (got.status, got.output_file_id, got.in_flight) == ("completed", "file-o", 0)
    assert not await batches.redis.exists(batches.keys.batch_done("batch_1"), batches.keys.batch_lease("batch_1"))
    assert await batches.redis.zrange(batches.keys.active_batches, 0, -1) == []


async def test_cancel_ends_an_idle_batch_at_once_and_asks_a_running_one(batches: Batches) -> None:
    await batches.create(state("batch_idle"))
    assert await batches.cancel("batch_idle", OPERATOR) == "cancelled"
    assert await batches.cancel("batch_idle", OPERATOR) == "cancelled"
    assert await batches.cancel("batch_nope", OPERATOR) == ""
    await batches.create(state("batch_run"))
    await batches.acquire("batch_run", "a")
    assert await batches.cancel("batch_run", OPERATOR) == "cancelling"
    got = await batches.get("batch_run", OPERATOR)
    assert got and got.cancelling_at and got.cancelled_at is None
    await batches.end("batch_run", "a", "completed")
    assert await batches.cancel("batch_run", OPERATOR) == "completed"


def test_windows_and_result_ids() -> None:
    assert [window_seconds(w) for w in ("24h", "3s", "2d", "90m")] == [86400, 3, 172800, 5400]
    with pytest.raises(ValueError):
        window_seconds("tomorrow")
    assert result_file_id("batch_1", "output") == result_file_id("batch_1", "output") != result_file_id(
        "batch_1", "error")


def test_the_rq_job_of_a_batch_lives_under_the_prefix_and_not_past_its_batch(redis_url: str) -> None:
    """In its own interpreter: rq takes its key prefix when first imported."""
    prefix = f"queue{time.time_ns()}"
    code = f"""
        import json, redis
        from common.batch.store import BatchQueue, longest_life_s
        from common.keys import Keys
        from common.settings import Settings
        connection, settings = redis.Redis.from_url({redis_url!r}), Settings(files_ttl_s=3600)
        job_id = BatchQueue(connection, Keys({prefix!r}), settings).enqueue("batch_1")
        print(json.dumps({{"job": job_id, "longest": longest_life_s(settings)}}))
        """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    r, rq = redis.Redis.from_url(redis_url), Keys(prefix).rq_prefix
    assert r.lrange(f"{rq}:queue:{prefix}-batches", 0, -1) == [out["job"].encode()]
    assert r.hget(f"{rq}:job:{out['job']}", "description") == b"batch batch_1"
    assert out["longest"] - 60 < r.ttl(f"{rq}:job:{out['job']}") <= out["longest"]
    assert not [k for k in r.scan_iter(match="*") if out["job"].encode() in k and not k.startswith(rq.encode())]


async def test_another_tenants_batch_is_a_missing_one(batches: Batches) -> None:
    a, b = Caller("a"), Caller("b")
    for i, (batch_id, owner) in enumerate((("batch_b", "b"), ("batch_a", "a"), ("batch_old", None))):  # oldest first
        made = state(batch_id)
        await batches.create(made.model_copy(update={"owner": owner, "created_at": made.created_at + i}))
    assert [s.id for s in (await batches.page(None, 10, a))[0]] == ["batch_a"]
    assert (await batches.page("batch_b", 10, a))[0] == (await batches.page("batch_never", 10, a))[0]  # no oracle
    assert await batches.get("batch_b", a) is None and await batches.get("batch_old", a) is None
    assert await batches.cancel("batch_b", a) == ""  # as for no such batch, and nothing changed
    assert (await batches.get("batch_b", b)).status == "validating"
    assert {s.id for s in (await batches.page(None, 10, OPERATOR))[0]} == {"batch_a", "batch_b", "batch_old"}


async def _events(batches: Batches) -> list[tuple[str, str, str]]:
    """(type, batch id, tenant) of each webhook event emitted so far."""
    out = []
    for _, fields in await batches.redis.xrange(batches.keys.webhooks):
        event = json.loads(fields[b"e"])
        out.append((event["type"], event["data"]["id"], fields[b"t"].decode()))
    return out


async def test_a_batch_s_end_emits_its_webhook_event_once_to_its_owner(batches: Batches) -> None:
    """In the script that ends it: a batch that ended has its event; a runner that lost its lease emits none."""
    await batches.create(state("batch_w").model_copy(update={"owner": "alpha"}))
    await batches.acquire("batch_w", "a")
    assert not await batches.end("batch_w", "b", "completed")  # not the holder: no end, no event
    assert await _events(batches) == []
    assert await batches.end("batch_w", "a", "expired", expired_at=1)
    assert not await batches.end("batch_w", "a", "expired")  # the lease went with the end
    assert await _events(batches) == [("batch.expired", "batch_w", "alpha")]
    assert 0 < await batches.redis.ttl(batches.keys.webhooks)


async def test_a_cancel_that_ends_an_idle_batch_emits_batch_cancelled(batches: Batches) -> None:
    await batches.create(state("batch_idle").model_copy(update={"owner": "beta"}))
    await batches.create(state("batch_run"))
    await batches.acquire("batch_run", "a")
    assert await batches.cancel("batch_run", OPERATOR) == "cancelling"  # its runner ends it (and emits then)
    assert await batches.cancel("batch_idle", OPERATOR) == "cancelled"
    assert await batches.cancel("batch_idle", OPERATOR) == "cancelled"  # already: nothing more
    assert await _events(batches) == [("batch.cancelled", "batch_idle", "beta")]
