"""Autoscaling that fires: what KEDA would compute from deploy/kubernetes/keda.yaml, on a real Redis (the embedded
6.2 and Debian's 7), during a real backlog of ovq jobs, and again once ovq's workers have drained it; and from zero
replicas to one and back, for a request, a batch line, and a request waiting for a never-announced model's card."""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
import redis
import redis.asyncio as aioredis

from api.queue.registry import CARD_CACHE_S, Registry
from common.jobs import LEVELS, Job
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.models.sources import load_models
from common.servable import ServableType
from common.settings import Settings
from tests.conftest import MODEL
from tests.deploy.conftest import DEPLOY, KUBERNETES
from tests.deploy.keda import StreamScaler, Workload

pytestmark = pytest.mark.deploy

DEVICE = "CPU"
# A database of its own on the session's Redis, so the stream's real name collides with no other test.
DB = 9


@pytest.fixture()
def scaler() -> StreamScaler:
    return StreamScaler.from_file(KUBERNETES / "keda.yaml")


@pytest.fixture(params=["redis-6.2-embedded", "redis-7-debian"])
def client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    url = request.getfixturevalue("redis_url" if request.param.endswith("embedded") else "redis7_url")
    parsed = urlparse(url)
    connection = redis.Redis(host=parsed.hostname, port=parsed.port, db=DB)
    connection.flushdb()
    yield connection
    connection.flushdb()
    connection.close()


def _enqueue(client: redis.Redis, stream: str, count: int) -> None:
    """Jobs as the API queues them (the same fields in the same stream), for a model whose worker is busy."""
    for n in range(count):
        job = Job(model=MODEL, device=DEVICE, kind="completion", prompt=f"backlog {n}", reply_to="autoscale-test")
        client.xadd(stream, job.to_fields())


def _take(client: redis.Redis, stream: str, consumer: str, count: int) -> list[bytes]:
    reply = client.xreadgroup(GROUP, consumer, {stream: ">"}, count=count)
    return [entry_id for entry_id, _ in reply[0][1]] if reply else []


def _finish(client: redis.Redis, stream: str, ids: list[bytes]) -> None:
    """What a worker does with a finished job: acknowledge it and delete it from the stream."""
    client.xack(stream, GROUP, *ids)
    client.xdel(stream, *ids)


def test_scaled_object_watches_the_stream_ovq_queues_into(scaler: StreamScaler) -> None:
    assert scaler.mode == "length", "consumerGroup makes KEDA ignore streamLength; lag needs Redis 7 and breaks"
    assert scaler.stream == Keys().jobs(MODEL, DEVICE)
    (model,) = [m for m in load_models(DEPLOY / "models.yaml") if m.name == MODEL]
    assert scaler.target == model.max_num_seqs, "one replica per max_num_seqs jobs waiting or running"
    assert scaler.min_replicas == 0 < scaler.max_replicas, "scales to zero"
    workload = Workload.from_file(KUBERNETES / "keda.yaml")
    keys = Keys()
    assert [(s.mode, s.stream) for s in workload.scalers] == [
        ("length", keys.level_jobs(MODEL, DEVICE, level)) for level in ("interactive", "high", "low", "batch")] + [
        ("list", keys.awaiting(MODEL, DEVICE))]
    assert all(s.target == model.max_num_seqs and s.activation == 0 for s in workload.scalers)


def test_backlog_scales_out_and_drained_stream_scales_back(client: redis.Redis, scaler: StreamScaler) -> None:
    stream = scaler.stream
    client.xgroup_create(stream, GROUP, id="0", mkstream=True)  # as every worker does at start
    assert scaler.desired_replicas(scaler.metric(client), current=1) == scaler.min_replicas

    # A burst: the only worker takes what its engine can run now, the rest stays in the stream.
    burst = 3 * scaler.target + 5
    _enqueue(client, stream, burst)
    running = _take(client, stream, "worker-1", scaler.target)
    assert len(running) == scaler.target
    metric = scaler.metric(client)
    assert metric == burst, "XLEN counts the waiting jobs and the ones in flight"
    desired = scaler.desired_replicas(metric, current=1)
    assert desired == min(scaler.max_replicas, math.ceil(burst / scaler.target))
    assert desired > scaler.min_replicas

    # New replicas join and share the backlog; everyone finishes jobs out of order (short ones first).
    others = [_take(client, stream, f"worker-{n}", scaler.target) for n in range(2, desired + 1)]
    for batch in reversed([running, *others]):
        _finish(client, stream, batch)
    while batch := _take(client, stream, "worker-1", scaler.target):
        _finish(client, stream, batch)
    assert client.xpending(stream, GROUP)["pending"] == 0
    assert scaler.metric(client) == 0
    assert scaler.desired_replicas(scaler.metric(client), current=desired) == scaler.min_replicas


def test_group_lag_cannot_drive_scaling_with_ack_and_delete(redis7_url: str, scaler: StreamScaler) -> None:
    """Why keda.yaml does not use `lagCount`: under a backlog, once a later job finishes before an earlier one (its
    entry deleted while the earlier is still pending), Redis 7 reports the group's lag as nil: KEDA reads 0."""
    parsed = urlparse(redis7_url)
    client = redis.Redis(host=parsed.hostname, port=parsed.port, db=DB)
    client.flushdb()
    try:
        stream = scaler.stream
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        _enqueue(client, stream, 3 * scaler.target)
        first = _take(client, stream, "worker-1", scaler.target)
        second = _take(client, stream, "worker-2", scaler.target)
        _finish(client, stream, second)  # the later jobs were shorter
        waiting = client.xlen(stream) - client.xpending(stream, GROUP)["pending"]
        assert waiting == scaler.target, "a real backlog"
        lag_scaler = StreamScaler(stream, "lag", scaler.target, GROUP, scaler.min_replicas, scaler.max_replicas)
        assert lag_scaler.metric(client) != waiting, "Redis now reports the lag right: lagCount became an option"
        assert lag_scaler.desired_replicas(lag_scaler.metric(client), current=1) == scaler.min_replicas
        assert scaler.desired_replicas(scaler.metric(client), current=1) > scaler.min_replicas
        _finish(client, stream, first)
    finally:
        client.flushdb()
        client.close()


def test_from_zero_to_one_and_back_to_zero(client: redis.Redis) -> None:
    """Each thing that waits for a worker wakes the scaled-to-zero workload, as the API leaves it in Redis; once
    a worker has done it (or the wait has ended), KEDA takes the workload back to zero."""
    workload = Workload.from_file(KUBERNETES / "keda.yaml")
    keys = Keys()
    kwargs = client.connection_pool.connection_kwargs
    card = ModelCard(name=MODEL, device=DEVICE, servable_type=ServableType.LM_CB, context_length=64,
                     chat_template="x", created=int(time.time()))

    async def run() -> None:
        connection = aioredis.Redis(host=kwargs["host"], port=kwargs["port"], db=DB)
        registry = Registry(connection, keys, Settings(queue_timeout_s=30), expected=[MODEL],
                            devices={MODEL: [DEVICE]})
        try:
            assert workload.desired_replicas(client) == 0, "nothing waits: zero replicas"

            # The model's worker announced itself once (its card outlives it); no worker is live now.
            await connection.hset(keys.model(MODEL), DEVICE, card.model_dump_json())
            servable = await registry.servable(MODEL)
            for priority in LEVELS:  # every level's queue wakes the workload
                where = keys.level_jobs(MODEL, DEVICE, priority)
                job = Job(model=MODEL, device=DEVICE, kind="completion", prompt="wake up", reply_to="scale-test",
                          priority=priority)
                queued = await registry.enqueue(servable, job)
                assert not queued.live and queued.stream == where
                assert workload.desired_replicas(client, current=0) == 1, priority
                client.xgroup_create(where, GROUP, id="0", mkstream=True)  # the worker KEDA started
                _finish(client, where, _take(client, where, "worker-1", 1))
                assert workload.desired_replicas(client, current=1) == 0, priority

            # Never announced (or past the card TTL): the request waits for a card, counted where KEDA looks.
            await connection.delete(keys.model(MODEL))
            await asyncio.sleep(CARD_CACHE_S)  # the API's second of card cache forgets it
            waiting = asyncio.ensure_future(registry.servable(MODEL))
            deadline = time.monotonic() + 10
            while workload.desired_replicas(client, current=0) == 0:
                assert time.monotonic() < deadline and not waiting.done()
                await asyncio.sleep(0.05)
            assert workload.desired_replicas(client, current=0) == 1
            await connection.hset(keys.model(MODEL), DEVICE, card.model_dump_json())  # the worker is up
            await waiting
            assert workload.desired_replicas(client, current=1) == 0
        finally:
            await registry.close()
            await connection.aclose()

    asyncio.run(run())
