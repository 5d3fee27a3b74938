"""ovq on a Redis Cluster (`REDIS_URL=redis+cluster://...`): a real 3-master cluster with one replica each, from
Debian's redis-server >= 7 on loopback ports, every node on deploy/redis/users-cluster.acl. The API, a worker of the
tiny model and the batch worker, each as its documented ACL user, serve chat, streamed and unary, through the OpenAI
SDK; a stream closed early is cancelled at its worker (sharded pub/sub, on the model's node); every key a job wrote
lives on its model's master; a batch runs (rq on the master of the Batch API's slot); no node refuses anything. The
slot of the model's queue is then resharded to another master under load, and last its master is SIGKILLed under
load (the issue's counts: accepted, completed, failed cleanly, hung, lost, 5xx other than 503, seconds until a new
request succeeds). One cluster and one set of tiers serve the module's tests, in that order."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest
import redis
from openai import OpenAI
from redis.crc import key_slot

from common.jobs import ENTRY_JOB
from common.keys import GROUP
from tests.conftest import ROOT, Tiers
from tests.integration.redis_ha import ClusterSet, Node, missing_for_cluster
from tests.integration.test_batch import BATCH_ENV, answered_once, batch_worker, client_for, line, results, start, wait
from tests.integration.test_failover import QUEUED, STREAMS, probe, under_load
from tests.integration.test_faults import TINY, Counts, in_threads, join, stream, tiny, unary
from tests.integration.test_redis_security import denied

pytestmark = pytest.mark.skipif(missing_for_cluster() is not None, reason=str(missing_for_cluster()))
HI = [{"role": "user", "content": "hi"}]
ONCE = {"ignore_eos": True}  # the tiny model samples at temperature 1: without it its first token is sometimes EOS
PREFIX = "ovqacl"  # the ACL file's key and channel patterns (`ovq:*`) rewritten to it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    """One cluster for the module, every node on deploy/redis/users-cluster.acl (replicas link up as `ovq-replica`;
    the tests' own reads log in as `admin`). The test that kills a master comes last."""
    work = tmp_path_factory.mktemp("cluster")
    acl = (ROOT / "deploy" / "redis" / "users-cluster.acl").read_text()
    acl = acl.replace("~ovq:*", f"~{PREFIX}:*").replace("&ovq:*", f"&{PREFIX}:*")
    acl = acl.replace(" +client|setinfo", "") + "user admin on >admin-pw ~* &* +@all\n"  # Debian's 7.0: no SETINFO
    (work / "users.acl").write_text(acl)
    made = ClusterSet(work / "nodes", acl=work / "users.acl")
    yield made
    made.stop()


@pytest.fixture(scope="module")
def served(cluster: ClusterSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    """The API, a worker of the tiny model and the batch worker on the cluster, each as its documented ACL user,
    shared by the module's tests (`t.env`'s REDIS_URL, the operator's CLI's, is the `admin` login)."""
    t = Tiers(cluster.url_for("admin", "admin-pw"), tmp_path_factory.mktemp("served"), tiny(max_num_seqs=STREAMS),
              OVQ_KEY_PREFIX=PREFIX, **BATCH_ENV)
    t.prefix = PREFIX
    t.api(REDIS_URL=cluster.url_for("ovq-api", "change-me-api"))
    t.worker(TINY, REDIS_URL=cluster.url_for("ovq-worker", "change-me-worker"))
    t.wait_served(TINY)
    batch_worker(t, "bw", REDIS_URL=cluster.url_for("ovq-batch", "change-me-batch"))
    yield t
    t.stop()


def test_chat_streams_unary_cancels_and_batches_as_the_acl_users(served: Tiers, cluster: ClusterSet) -> None:
    """Chat unary (a tenant's: the fair-share read) and streamed, a stream closed early cancelled at its worker
    (sharded pub/sub, on the model's node), a batch (rq on the master of the Batch API's slot), `/ops` and `ovq
    status` (as `ovq-operator`): every key a job wrote lives on its model's master, and no node refused anything."""
    t = served
    [api, _, batcher] = t.procs
    batch = start(client_for(t), [line(i) for i in range(6)])  # rq on the master of the Batch API's slot
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=60)
    answer = client.chat.completions.create(model=TINY, messages=HI, max_tokens=3, extra_body=ONCE)
    assert answer.usage.completion_tokens == 3
    fair = client.chat.completions.create(model=TINY, messages=HI, max_tokens=3, user="tenant-a", extra_body=ONCE)
    assert fair.usage.completion_tokens == 3  # parked for fair shares, taken by the worker's fair read
    streamed = list(client.chat.completions.create(model=TINY, messages=HI, max_tokens=3, stream=True,
                                                   stream_options={"include_usage": True}, extra_body=ONCE))
    assert streamed[-1].usage.completion_tokens == 3
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    long = client.chat.completions.create(model=TINY, messages=HI, max_tokens=1900, stream=True, extra_body=ONCE)
    first = next(iter(long))
    long.close()
    keys, r = t.keys, cluster.client()
    stream_key = keys.jobs(TINY, "CPU")
    deadline = time.monotonic() + 20  # the cancel reached the worker: it acked the job well before 1900 tokens
    while r.xpending(stream_key, GROUP)["pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.xpending(stream_key, GROUP)["pending"] == 0
    cancelled = keys.job(first.id.removeprefix("chatcmpl-"), TINY)
    assert r.hget(cancelled, "status") == b"cancelled", r.hgetall(cancelled)  # it heard the cancel: not 1900 tokens
    node = r.get_node_from_key(stream_key).name
    job = keys.job(answer.id.removeprefix("chatcmpl-"), TINY)
    assert r.hget(job, "status") == b"done", r.hgetall(job)
    assert r.get_node_from_key(job).name == node
    ended = wait(client_for(t), batch.id)
    assert ended.status == "completed", (ended, denied_anywhere(cluster))
    answered_once(*results(client_for(t), ended), [f"req-{i}" for i in range(6)])
    assert r.get_node_from_key(keys.batch(batch.id)).name == r.get_node_from_key(keys.rq_prefix + ":queues").name
    assert batcher.poll() is None
    ops = httpx.get(t.base_url.replace("/v3", "/ops/data"), timeout=30)  # the operators' views read every model's keys
    assert ops.status_code == 200, ops.text[:500]
    assert [s["node"] for s in ops.json()["streams"] if s["model"] == TINY] == [node], ops.json()["streams"]
    assert httpx.get(t.base_url.replace("/v3", "/metrics"), timeout=30).status_code == 200
    operator = {**t.env, "REDIS_URL": cluster.url_for("ovq-operator", "change-me-operator")}
    done = subprocess.run([sys.executable, "-m", "cli.main", "status", "--json"], env=operator, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert denied_anywhere(cluster) == []
    assert sum(redis.Redis(port=n.port, **cluster.auth).info("replication")["connected_slaves"]  # type: ignore[arg-type]
               for n in cluster.nodes) == 3
    logs = "".join(t.log(p) for p in t.procs)
    assert "Traceback" not in logs and "CROSSSLOT" not in logs and "NOPERM" not in logs, logs[-3000:]
    assert api.poll() is None
    r.close()


def denied_anywhere(cluster: ClusterSet) -> list[tuple]:
    """What any node's ACL refused: (port, user, command, key or channel)."""
    return [(n.port, *d) for n in cluster.nodes
            for d in denied(redis.Redis(port=n.port, **cluster.auth))]  # type: ignore[arg-type]


def test_the_queues_slot_resharded_while_serving_loses_no_request(served: Tiers, cluster: ClusterSet) -> None:
    """The slot of the model's queue and jobs moves to another master (IMPORTING and MIGRATING, its keys MIGRATEd a
    few at a time, then SETSLOT NODE) while 8 clients send streamed and unary requests one after another: every
    request completes (the tiers follow ASK behind ASKING, wait out TRYAGAIN while a script's keys are split between
    the two masters, then follow MOVED), and the queue is served from its new master."""
    t = served
    [_, worker, _] = t.procs
    keys, r = t.keys, cluster.client()
    stream_key = keys.jobs(TINY, "CPU")
    source = r.get_node_from_key(stream_key).port
    target = next(node.port for node in r.get_primaries() if node.port != source)
    r.close()
    body = {"model": TINY, "messages": HI, "max_tokens": 8, "ignore_eos": True}
    counts, stop = [Counts() for _ in range(8)], threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            (stream if i % 2 else unary)(t.base_url, body, counts[i])

    def completed() -> int:
        return sum(c.completed for c in counts)

    threads = in_threads(8, client)
    wait_until(lambda: completed() >= 16, 60, "requests completing before the resharding")
    before = completed()
    moved = cluster.move_slot(key_slot(stream_key.encode()), target)
    during = completed() - before
    wait_until(lambda: completed() >= before + during + 16, 60, "requests completing after the resharding")
    stop.set()
    join(threads)
    after = cluster.client()
    print(f"cluster resharding: {moved} keys of the queue's slot moved from port {source} to {target}; requests "
          f"completed: {before} before, {during} during, {completed() - before - during} after; "
          f"{[str(c) for c in counts if c.failed or c.hung or c.internal]}")
    assert after.get_node_from_key(stream_key).port == target and moved
    assert all(c.failed == c.hung == c.internal == 0 for c in counts), [str(c) for c in counts]
    wait_until(lambda: after.xlen(stream_key) == 0, 30, "every job acknowledged on the new master")
    assert worker.poll() is None
    logs = "".join(t.log(p) for p in t.procs)
    assert "Traceback" not in logs and "CROSSSLOT" not in logs, logs[max(0, logs.find("Traceback") - 1500):][:5000]
    after.close()


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.1)


def live_client(cluster: ClusterSet, dead: Node) -> redis.RedisCluster:
    """A client that learns the cluster from a node still running."""
    return redis.RedisCluster(host="127.0.0.1", port=next(n.port for n in cluster.nodes if n is not dead),
                              **cluster.auth)  # type: ignore[arg-type]


def test_a_killed_master_fails_over_with_nothing_hung_or_lost(served: Tiers, cluster: ClusterSet) -> None:
    """The master of the model's queue SIGKILLed while 32 streams run and 200 unary requests wait in its queue:
    nothing hangs, nothing 5xx but 503, no acknowledged job is lost (each enqueue WAITs for the replica), and new
    requests are served through the promoted replica without a restart."""
    t = served
    [api, worker, batch] = t.procs
    keys, r = t.keys, cluster.client()
    master = cluster.node(r.get_node_from_key(keys.jobs(TINY, "CPU")).port)
    streams, unaries, running, queued = under_load(t, lambda job: bool(r.exists(keys.job(job, TINY))))
    waiting = [entry for _, entry in r.xrange(keys.jobs(TINY, "CPU"))]
    [reply_to] = r.zrange(keys.apis, 0, -1)
    shared = r.get_node_from_key(keys.events(reply_to.decode(), TINY)).port == master.port  # its events too
    r.close()
    master.kill()
    again, first, live = Counts(), [], []
    killed = time.monotonic()
    prober = threading.Thread(target=probe, args=(t, again, killed, first, live))
    prober.start()
    join([*running, *queued, prober])
    assert first, f"no new request completed within 60s of the kill: {again}"
    assert set(live) <= {200}, f"liveness during the failover: {live}"
    after = live_client(cluster, master)
    ids = {orjson.loads(entry[ENTRY_JOB.encode()])["id"] for entry in waiting} | {f"unary-{i}" for i in range(QUEUED)}
    lost = [job_id for job_id in ids if not after.exists(keys.job(job_id, TINY))]
    promoted = after.get_node_from_key(keys.jobs(TINY, "CPU")).port
    print(f"cluster failover: streams {streams}; unary {unaries}; new requests {again}; a new request completed "
          f"{first[0]:.1f}s after the kill; acknowledged before it: {len(ids)} jobs ({len(waiting)} in the stream), "
          f"lost: {len(lost)}; the queue's master now on port {promoted} (was {master.port}); the API's event channel "
          f"{'was' if shared else 'was not'} on the killed master")
    assert not lost
    assert promoted != master.port
    # The batch worker rode the failover out (rq retries a lost connection; CLUSTERDOWN once ended it, a traceback).
    assert batch.poll() is None and "Traceback" not in t.log(batch), t.log(batch)[-3000:]
    for counts in (streams, unaries):
        assert counts.hung == counts.internal == counts.broken == 0, counts
        assert counts.completed + counts.failed == (STREAMS if counts is streams else QUEUED), counts
    for counts in (unaries, again):
        other = [error for error in counts.errors if not error.startswith("503 ")]
        assert not other, other[:5]
    status = subprocess.run([sys.executable, "-m", "cli.main", "status", "--json"], env=t.env, cwd=ROOT,
                            capture_output=True, timeout=60, check=True)
    [queue] = orjson.loads(status.stdout)["streams"]
    assert queue["node"] == f"127.0.0.1:{promoted}", "ovq status names the queue's master now"
    assert worker.poll() is None and api.poll() is None
    logs = t.log(worker) + t.log(api)
    assert "Traceback" not in logs, logs[max(0, logs.find("Traceback") - 1500):][:5000]
    after.close()
