"""The Redis Cluster key layout on a real 3-master cluster with one replica each (Debian's redis-server >= 7 on
loopback ports): the queue and Batch API scripts find all their keys in one slot when they are named by
`Keys(cluster=True)` (a cross-slot script is refused: CROSSSLOT); the dead-letter retry and the reclaimer's cleanup work
across slots; the queues of different models spread over the masters. The tiers on a Cluster:
tests/integration/test_cluster.py."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster

from api.queue.registry import ENQUEUE, WITHDRAW
from common.batch.store import CANCEL, END, RECORD, RENEW, UPDATE
from common.fairness import PARK
from common.jobs import Job
from common.keys import GROUP, Keys
from common.ops import control
from common.redis.cluster import ClusterLane, slot_of
from common.settings import Settings
from tests.integration.redis_ha import ClusterSet, missing_for_cluster
from workers.queue.intake import READ, unpack
from workers.queue.reclaim import FORGET, Reclaimer
from workers.queue.share import CORRECT
from workers.vitals import Member

pytestmark = pytest.mark.skipif(missing_for_cluster() is not None, reason=str(missing_for_cluster()))
KEYS = Keys("ovq", cluster=True)
MODELS = [f"model-{i}" for i in range(8)]
DEVICES = ("CPU", "GPU")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    made = ClusterSet(tmp_path_factory.mktemp("cluster"))
    yield made
    made.stop()


@pytest.fixture()
def client(cluster: ClusterSet) -> Iterator[redis.RedisCluster]:
    made = cluster.client()
    yield made
    made.close()


def test_queue_scripts_of_one_model_touch_one_slot(client: redis.RedisCluster) -> None:
    for model in MODELS[:3]:
        job = f"job-{model}"
        # Per device: its workers, its interactive stream (the backlog measured), the stream of the job's level, that
        # level's fair order and clock, the device's bell (common/fairness.py).
        queues = [k for d in DEVICES
                  for k in (KEYS.workers(model, d), KEYS.jobs(model, d), KEYS.level_jobs(model, d, "low"),
                            KEYS.fair_order(model, d, "low"), KEYS.fair_clock(model, d, "low"),
                            KEYS.fair_bell(model, d))]
        for d in DEVICES:
            for stream in (KEYS.jobs(model, d), KEYS.level_jobs(model, d, "low"), KEYS.batch_jobs(model, d)):
                client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        now = time.time()
        chosen, _, entry, parked = client.register_script(ENQUEUE)(
            keys=[KEYS.job(job, model), *queues],
            args=[now - 30, 100, 60, now, "api1", model, "low", "tenant", 10,
                  *(x for d in DEVICES for x in (d, "{}"))]).split()
        assert parked == b"1"
        chosen = int(chosen)
        device = DEVICES[chosen - 1]
        stream = KEYS.level_jobs(model, device, "low")
        order, clock = KEYS.fair_order(model, device, "low"), KEYS.fair_clock(model, device, "low")
        assert client.register_script(WITHDRAW)(keys=[stream, KEYS.job(job, model), order, clock],
                                                args=[entry, "tenant"]) == 1
        assert client.hget(KEYS.job(job, model), "status") == b"cancelled"
        client.xadd(stream, {"job": "plain"})
        mine = queues[6 * (chosen - 1):6 * chosen]  # parked again, on that device alone
        _, _, entry, parked = client.register_script(ENQUEUE)(
            keys=[KEYS.job(job, model), *mine], args=[now - 30, 100, 60, now, "api1", model, "low", "tenant", 10,
                                                       device, "{}"]).split()
        streams = [stream, KEYS.batch_jobs(model, device)]
        read = client.register_script(READ)
        for expected in (b"plain", entry):  # the plain entry first, then the parked one
            which, entries, _ = unpack(read(keys=[*streams, order, KEYS.fair_order(model, device, "batch"), clock,
                                                  KEYS.fair_clock(model, device, "batch")],
                                            args=[GROUP, "w1", 1, 10_000, 1, 2, PARK]))
            assert which == 1 and len(entries) == 1, "the intake read nothing from the stream it was given"
            assert expected in (entries[0][0], *entries[0][1].values())
        correct = client.register_script(CORRECT)  # the job's end: its tenant's correction, once (one slot)
        assert [correct(keys=[clock, KEYS.job(job, model)], args=["tenant", -3, 60]) for _ in range(2)] == [1, 0]
        # FORGET reads the stream and its consumers' worker hashes: those are keyed by worker, not model (the
        # tiers' cluster mode must split it); with the stream alone it runs on the stream's node
        assert client.register_script(FORGET)(keys=[stream], args=[GROUP]) == 0


def test_batch_scripts_touch_one_slot(client: redis.RedisCluster) -> None:
    lease, batch, done = KEYS.batch_lease("b1"), KEYS.batch("b1"), KEYS.batch_done("b1")
    client.set(lease, "token", ex=60)
    client.hset(batch, mapping={"id": "b1", "status": "in_progress"})
    client.expire(batch, 600)
    assert client.register_script(RENEW)(keys=[lease], args=["token", 60_000]) == 1
    assert client.register_script(UPDATE)(keys=[lease, batch], args=["token", "in_progress", "total", 1]) \
        == b"in_progress"
    assert client.register_script(RECORD)(
        keys=[lease, done, batch, KEYS.batch_stats("m"), KEYS.batch_stats_models],
        args=["token", "line-1", "{}", "completed", 1, 2, time.time(), 3600, "m"]) == 1
    assert client.register_script(CANCEL)(keys=[batch, lease, done, KEYS.active_batches, KEYS.webhooks],
                                          args=[time.time(), 600, "{}", 100, 600]) == b"cancelling"
    assert client.register_script(END)(keys=[lease, batch, done, KEYS.active_batches, KEYS.webhooks],
                                       args=["token", 600, "b1", "{}", 100, 600, "status", "cancelled"]) == 1
    assert client.xlen(KEYS.webhooks) == 1  # its webhook event, emitted in the same script


def test_a_script_across_models_is_refused(client: redis.RedisCluster) -> None:
    """What the layout prevents: one script over two models' slots."""
    a, b = (KEYS.jobs(m, "CPU") for m in MODELS[:2])
    assert client.keyslot(a) != client.keyslot(b)
    node = redis.Redis(port=client.get_node_from_key(a).port)  # past redis-py's own check, to the server's
    with pytest.raises(redis.exceptions.ClusterCrossSlotError):
        node.eval("return redis.call('XLEN', KEYS[1]) + redis.call('XLEN', KEYS[2])", 2, a, b)
    node.close()


def test_queues_of_different_models_land_on_different_masters(client: redis.RedisCluster) -> None:
    masters = {client.get_node_from_key(KEYS.jobs(m, "CPU")).name for m in MODELS}
    assert len(masters) == 3
    for m in MODELS:  # a model's card, workers and jobs' own keys are where its queue is
        node = client.get_node_from_key(KEYS.jobs(m, "CPU")).name
        assert {client.get_node_from_key(k).name for k in (KEYS.model(m), KEYS.job("j", m), KEYS.journal("j", m))} \
            == {node}


async def test_a_dead_letter_is_retried_across_slots(cluster: ClusterSet) -> None:
    """The dead-letter stream and a job's model are in different slots: the retry claims the letter, then queues
    the job in its model's slot."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    job = Job(model=MODELS[3], device="CPU", kind="completion", prompt="hi", reply_to="api1")
    assert client.keyslot(KEYS.dead) != client.keyslot(KEYS.jobs(job.model, job.device))
    entry = (await client.xadd(KEYS.dead, job.to_fields())).decode()
    await client.hset(KEYS.job(job.id, job.model), mapping={"status": "failed", "error": "boom"})
    await control.retry(client, KEYS, Settings(), entry)
    [(_, fields)] = await client.xrange(KEYS.jobs(job.model, job.device))
    assert Job.from_fields(fields).id == job.id
    assert await client.hget(KEYS.job(job.id, job.model), "status") == b"queued"
    with pytest.raises(control.NotFound):
        await control.retry(client, KEYS, Settings(), entry)
    await client.aclose()


async def test_dead_consumers_are_forgotten_but_not_a_live_workers(cluster: ClusterSet) -> None:
    """The reclaimer's cleanup reads worker hashes in other slots than the stream's: they are checked first, then
    the stream's script removes the dead consumers that hold nothing."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    model = MODELS[4]
    member = Member("w1", model, "CPU", KEYS.jobs(model, "CPU"), KEYS.batch_jobs(model, "CPU"), started=time.time())
    await client.xgroup_create(member.stream, GROUP, id="0", mkstream=True)
    for consumer in ("gone", "alive"):
        await client.xgroup_createconsumer(member.stream, GROUP, consumer)
    await client.hset(KEYS.worker("alive"), "host", "h")  # a worker hash, but not (yet) in the model's live set
    assert client.keyslot(KEYS.worker("alive")) != client.keyslot(member.stream)
    await asyncio.sleep(0.1)
    reclaimer = Reclaimer(client, KEYS, Settings(worker_ttl_s=0.05), member, lambda: 10)
    assert await reclaimer.forget_dead_consumers(member.stream, set()) == 1
    assert [c["name"] for c in await client.xinfo_consumers(member.stream, GROUP)] == [b"alive"]
    await client.aclose()



async def test_a_lane_follows_moved_to_the_slots_master(cluster: ClusterSet) -> None:
    """A stale slot map (the slot's master moved): the lane's command is answered MOVED, the map is learnt again
    and the command sent to the right master; a keyless command goes where the one before it went; subscriber
    counts of channels on several masters come back as one PUBSUB NUMSUB reply."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    await client.initialize()
    key = KEYS.job("j", MODELS[5])
    right = client.get_node_from_key(key)
    client.nodes_manager.slots_cache[slot_of(key)] = [next(n for n in client.get_primaries() if n.name != right.name)]
    lane = ClusterLane(client)
    assert await lane.execute([["SET", key, "v"], ["GET", key], ["PING"]]) == [b"OK", b"v", b"PONG"]
    assert client.get_node_from_key(key).name == right.name
    channels = [KEYS.events(f"api-{i}") for i in range(6)]
    assert len({client.get_node_from_key(c).name for c in channels}) > 1
    [counts] = await lane.execute([["PUBSUB", "NUMSUB", *channels]])
    assert counts == [part for c in channels for part in (c.encode(), 0)]
    await lane.close()
    await client.aclose()


def start_migrating(sync: redis.RedisCluster, key: str) -> tuple[int, Any, redis.Redis, redis.Redis, str]:
    """Mark the slot of `key` as migrating from its master to another one: (slot, target node, source and target
    connections, target's id)."""
    slot, source = sync.keyslot(key), sync.get_node_from_key(key)
    target = next(n for n in sync.get_primaries() if n.name != source.name)
    src, dst = redis.Redis(port=source.port), redis.Redis(port=target.port)
    src_id, dst_id = (node.execute_command("CLUSTER", "MYID").decode() for node in (src, dst))
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    return slot, target, src, dst, dst_id


async def test_a_lane_follows_ask_to_a_migrating_slots_target(cluster: ClusterSet) -> None:
    """A slot migrating between masters: a key its source no longer has is answered ASK; the lane sends the command
    to the target behind ASKING, and it lands there."""
    sync = cluster.client()
    key = KEYS.job("asked", MODELS[6])
    slot, target, src, dst, _ = start_migrating(sync, key)
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    lane = ClusterLane(client)
    try:
        assert await lane.execute([["SET", key, "v"], ["PING"]]) == [b"OK", b"PONG"]
        with pytest.raises(redis.exceptions.AskError):  # the source has not got it: it sends askers on
            src.exists(key)
        pipe = dst.pipeline(transaction=False)  # one connection: ASKING lets the next command into the slot
        pipe.execute_command("ASKING")
        pipe.get(key)
        pipe.execute_command("ASKING")
        pipe.delete(key)
        assert pipe.execute()[1] == b"v"
    finally:
        for node in (src, dst):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            node.close()
        await lane.close()
        await client.aclose()
        sync.close()


async def test_a_lane_waits_out_tryagain_while_a_slot_migrates(cluster: ClusterSet) -> None:
    """A command over two keys of a migrating slot, one still on the source and one not: the source answers
    TRYAGAIN until the keys are together. The lane waits (a bounded number of times) and sends again; once the slot
    has moved it follows MOVED: the command is answered, not refused."""
    sync = cluster.client()
    kept, absent = KEYS.job("kept", MODELS[7]), KEYS.job("absent", MODELS[7])
    sync.set(kept, "v")
    slot, target, src, dst, dst_id = start_migrating(sync, kept)
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    lane = ClusterLane(client)
    try:
        with pytest.raises(redis.exceptions.TryAgainError):  # what the lane meets first
            src.mget(kept, absent)

        async def finish_the_migration() -> None:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(src.migrate, "127.0.0.1", target.port, [kept], 0, 5000)
            for node in (dst, src, *(redis.Redis(port=n.port) for n in sync.get_primaries())):
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

        moving = asyncio.ensure_future(finish_the_migration())
        assert await lane.execute([["MGET", kept, absent]]) == [[b"v", None]]
        await moving
        assert client.get_node_from_key(kept).name == target.name
    finally:
        dst.delete(kept)
        for node in (src, dst):
            node.close()
        await lane.close()
        await client.aclose()
        sync.close()
