"""Replicated Redis under load: the primary of a Sentinel-managed pair SIGKILLed while 32 streams run and 200
unary requests wait in the queue. Nothing hangs, nothing 5xx but 503, no acknowledged job is lost (each was on
the replica before its enqueue was acknowledged: WAIT), and the tiers serve again through the new primary
without a restart. Servers from Debian's packages (redis-server, redis-sentinel >= 7), on loopback ports."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from common.jobs import ENTRY_JOB
from common.keys import Keys
from common.redis.client import sync_client
from tests.conftest import ROOT, Tiers
from tests.integration.redis_ha import SentinelSet, missing_for_sentinel
from tests.integration.test_batch import BATCH_ENV, answered_once, batch_worker, client_for, line, results, start, wait
from tests.integration.test_faults import BOUND_S, HELLO, TINY, Counts, in_threads, join, stream, tiny, unary
from tests.integration.test_redis_security import denied, serve_and_chat

pytestmark = pytest.mark.skipif(missing_for_sentinel() is not None, reason=str(missing_for_sentinel()))
STREAMS, QUEUED = 32, 200


@pytest.fixture()
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    made = SentinelSet(tmp_path / "ha")
    yield made
    made.stop()


def under_load(t: Tiers, queued: Callable[[str], bool]) -> tuple[Counts, Counts, list, list]:
    """STREAMS long streams running, then QUEUED unary requests (`unary-N`) queued behind them (`queued(job)`: its
    hash exists): the load a node is killed under. Returns their counts and threads."""
    long = {"model": TINY, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1900, "ignore_eos": True}
    streams, unaries = Counts(), Counts()
    started = [threading.Event() for _ in range(STREAMS)]
    running = in_threads(STREAMS, lambda i: stream(t.base_url, long, streams, started[i]))
    for event in started:
        assert event.wait(60)
    waiting = in_threads(QUEUED, lambda i: unary_as(f"unary-{i}", t.base_url, HELLO, unaries))
    deadline = time.monotonic() + 120
    while sum(queued(f"unary-{i}") for i in range(QUEUED)) < QUEUED:  # all enqueued
        assert time.monotonic() < deadline, "the unary requests were not all queued"
        time.sleep(0.1)
    return streams, unaries, running, waiting


def unary_as(request_id: str, base_url: str, body: dict, counts: Counts) -> None:
    """`unary` with the job's id chosen (X-Request-Id), so the test can tell when Redis has it."""
    try:
        response = httpx.post(f"{base_url}/chat/completions", json=body, headers={"x-request-id": request_id},
                              timeout=BOUND_S)
    except httpx.TimeoutException:
        counts.add("hung")
        return
    if response.status_code == 200:
        counts.accepted += 1
        counts.add("completed")
    else:
        counts.errors.append(f"{response.status_code} {response.text[:200]}")
        counts.add("internal" if response.status_code == 500 else "failed")


def ready_again(t: Tiers, since: float, ready: list[float], bound_s: float = 60) -> None:
    """The API's readiness (it reaches Redis) polled from `since`: `ready` gets the seconds until it answers 200
    again after a 503 (the failover as the API sees it, whatever the backlog)."""
    url, seen_503 = t.base_url.replace("/v3", "/v2/health/ready"), False
    while time.monotonic() - since < bound_s:
        status = httpx.get(url, timeout=10).status_code
        if status == 503:
            seen_503 = True
        elif status == 200 and seen_503:
            ready.append(time.monotonic() - since)
            return
        time.sleep(0.05)


def probe(t: Tiers, counts: Counts, since: float, served: list[float], live: list[int], bound_s: float = 60) -> None:
    """New requests, one after another, from `since` until one completes: `served` gets the seconds that took;
    `live`, the liveness probe's status after each request that did not complete."""
    while time.monotonic() - since < bound_s:
        before = counts.completed
        unary(t.base_url, HELLO, counts, timeout=30)
        if counts.completed > before:
            served.append(time.monotonic() - since)
            return
        live.append(httpx.get(t.base_url.replace("/v3", "/v2/health/live"), timeout=10).status_code)
        time.sleep(0.1)


def test_a_killed_sentinel_primary_fails_over_with_nothing_hung_or_lost(
        tiers: Callable[..., Tiers], sentinel_set: SentinelSet) -> None:
    t = tiers(tiny(max_num_seqs=STREAMS), url=sentinel_set.url, **BATCH_ENV)
    api = t.api()
    worker = t.worker(TINY)
    t.wait_served(TINY)
    batcher = batch_worker(t, "bw")
    sdk = client_for(t)
    batch = start(sdk, [line(i) for i in range(20)])  # behind the interactive load: it runs across the failover
    keys = Keys(t.prefix)
    primary = redis.Redis(port=sentinel_set.primary.port)
    streams, unaries, running, queued = under_load(t, lambda job: bool(primary.exists(keys.job(job))))
    waiting = [entry for _, entry in primary.xrange(keys.jobs(TINY, "CPU"))]
    sentinel_set.primary.kill()
    again, served, live, ready = Counts(), [], [], []
    killed = time.monotonic()
    probers = [threading.Thread(target=probe, args=(t, again, killed, served, live)),
               threading.Thread(target=ready_again, args=(t, killed, ready))]
    for thread in probers:
        thread.start()
    join([*running, *queued, *probers])
    assert served, f"no new request completed within 60s of the kill: {again}"
    assert set(live) <= {200}, f"liveness during the failover: {live}"
    assert ready, "the API never reported Redis unreachable, or never reached it again"
    print(f"sentinel failover: streams {streams}; unary {unaries}; new requests {again}; the API reached a primary "
          f"again {ready[0]:.1f}s after the kill, a new request completed {served[0]:.1f}s after it (behind the queued "
          f"ones); new primary on port {sentinel_set.master_port()}")
    assert sentinel_set.master_port() == sentinel_set.replica.port
    new_primary = sync_client(sentinel_set.url)
    ids = {orjson.loads(entry[ENTRY_JOB.encode()])["id"] for entry in waiting} | {f"unary-{i}" for i in range(QUEUED)}
    lost = [job_id for job_id in ids if not new_primary.exists(keys.job(job_id))]
    print(f"acknowledged before the kill: {len(ids)} jobs ({len(waiting)} in the stream), lost: {len(lost)}")
    assert not lost
    for counts in (streams, unaries):
        assert counts.hung == counts.internal == counts.broken == 0, counts
        assert counts.completed + counts.failed == (STREAMS if counts is streams else QUEUED), counts
    for counts in (unaries, again):
        assert all(error.startswith("503 ") for error in counts.errors), counts.errors[:5]
    try:
        ended = wait(sdk, batch.id)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nbatch worker's log:\n{t.log(batcher)[-6000:]}") from None
    outputs, errors = results(sdk, ended)
    print(f"batch across the failover: {ended.status}, {ended.request_counts}")
    assert ended.status == "completed"
    answered_once(outputs, errors, [f"req-{i}" for i in range(20)])
    status = subprocess.run([sys.executable, "-m", "cli.main", "status", "--json"], env=t.env, cwd=ROOT,
                            capture_output=True, timeout=60, check=True)
    [queue] = orjson.loads(status.stdout)["streams"]
    assert queue["node"] == f"127.0.0.1:{sentinel_set.replica.port}", "ovq status names the new primary"
    assert worker.poll() is None and api.poll() is None and batcher.poll() is None
    assert "Traceback" not in t.log(worker) + t.log(api) + t.log(batcher)


def test_the_tiers_run_on_sentinel_with_the_documented_acl_users(tiers: Callable[..., Tiers], tmp_path: Path) -> None:
    """deploy/redis/users.acl on every data node: the replica links up as `ovq-replica`, the sentinels watch as
    `ovq-sentinel`, and the tiers, through the sentinels, as `ovq-api` (its enqueues WAIT for the replica) and
    `ovq-worker`: nothing refused."""
    acl = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    acl = acl.replace("~ovq:*", "~ovqacl:*").replace("&ovq:*", "&ovqacl:*") + "user admin on >admin-pw ~* &* +@all\n"
    acl = acl.replace(" +client|setinfo", "")  # Debian's Redis 7.0 has no CLIENT SETINFO (6.2 lets it pass, 7.2 has it)
    (tmp_path / "users.acl").write_text(acl)
    made = SentinelSet(tmp_path / "ha", acl=tmp_path / "users.acl")
    try:
        t = tiers(tiny(), url=made.url_for("admin", "admin-pw"), OVQ_KEY_PREFIX="ovqacl")
        t.prefix = "ovqacl"
        serve_and_chat(t, made.url_for("ovq-api", "change-me-api"), made.url_for("ovq-worker", "change-me-worker"))
        admin = sync_client(made.url_for("admin", "admin-pw"))
        assert denied(admin) == [], denied(admin)
        assert admin.info("replication")["connected_slaves"] == 1
    finally:
        made.stop()
