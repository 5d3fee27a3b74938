"""ovq on a Redis Cluster (`REDIS_URL=redis+cluster://...`): a real 3-master cluster with one replica each, from
Debian's redis-server >= 7 on loopback ports. The API and a worker of the tiny model serve chat, streamed and unary,
through the OpenAI SDK; a stream closed early is cancelled at its worker (sharded pub/sub, on the model's node);
every key a job wrote lives on its model's master."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from common.keys import GROUP, Keys
from common.redis.client import sync_client
from tests.conftest import Tiers
from tests.integration.redis_ha import ClusterSet, missing_for_sentinel
from tests.integration.test_faults import TINY, tiny

pytestmark = pytest.mark.skipif(missing_for_sentinel() is not None, reason=str(missing_for_sentinel()))
HI = [{"role": "user", "content": "hi"}]
ONCE = {"ignore_eos": True}  # the tiny model samples at temperature 1: without it its first token is sometimes EOS


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[ClusterSet]:
    made = ClusterSet(tmp_path / "cluster")
    yield made
    made.stop()


def test_chat_streams_unary_and_cancels_on_a_cluster(tiers: Callable[..., Tiers], cluster: ClusterSet) -> None:
    t = tiers(tiny(), url=cluster.url)
    t.api()
    t.worker(TINY)
    t.wait_served(TINY)
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=60)
    unary = client.chat.completions.create(model=TINY, messages=HI, max_tokens=3, extra_body=ONCE)
    assert unary.usage.completion_tokens == 3
    streamed = list(client.chat.completions.create(model=TINY, messages=HI, max_tokens=3, stream=True,
                                                   stream_options={"include_usage": True}, extra_body=ONCE))
    assert streamed[-1].usage.completion_tokens == 3
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    long = client.chat.completions.create(model=TINY, messages=HI, max_tokens=1900, stream=True, extra_body=ONCE)
    next(iter(long))
    long.close()
    keys, r = Keys(t.prefix, cluster=True), sync_client(t.redis_url)
    stream = keys.jobs(TINY, "CPU")
    deadline = time.monotonic() + 20  # the cancel reached the worker: it acked the job well before 1900 tokens
    while r.xpending(stream, GROUP)["pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.xpending(stream, GROUP)["pending"] == 0
    node = r.get_node_from_key(stream).name
    job = keys.job(unary.id.removeprefix("chatcmpl-"), TINY)
    assert r.hget(job, "status") == b"done", r.hgetall(job)
    assert r.get_node_from_key(job).name == node
    logs = "".join(t.log(p) for p in t.procs)
    assert "Traceback" not in logs and "CROSSSLOT" not in logs, logs[-3000:]
    r.close()
