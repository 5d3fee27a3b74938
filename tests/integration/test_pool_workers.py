"""Pool workers (`ovq worker --pool`): one process serves the models of the models file that have waiting work,
keeps those that fit its memory budget, swaps the one waited for in when they do not, unloads a model idle for its
`keep_alive`, and lets requests for a model nobody has loaded wait for it (scale from zero)."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis

from common.jobs import Job, SamplingParams
from common.keys import GROUP, Keys
from tests.conftest import MODELS, Tiers

A, B = "tiny-a", "tiny-b"
TWO = {A: {"path": str(MODELS / "tiny-llama"), "cache_size": 0, "max_num_seqs": 4},
       B: {"path": str(MODELS / "tiny-llama-draft"), "cache_size": 0, "max_num_seqs": 4}}
# workers/pool/footprint.py: these tiny models are about 257 MiB each (their growing KV cache's headroom).
ONE_FITS, BOTH_FIT = "400", "1024"


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def chat(t: Tiers, model: str, **extra: object) -> httpx.Response:
    # No retries; a read timeout well past a load's.
    return httpx.post(f"{t.base_url}/chat/completions", timeout=300,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra})


def pool_record(r: redis.Redis, keys: Keys) -> dict[str, object]:
    ids = r.zrange(keys.pools, 0, -1)
    if not ids:
        return {}
    raw = {k.decode(): v.decode() for k, v in r.hgetall(keys.pool(ids[0].decode())).items()}
    if raw:
        raw["models"] = {m["model"]: m["state"] for m in json.loads(raw["models"])}
    return raw


def live(r: redis.Redis, keys: Keys, model: str) -> int:
    return r.zcount(keys.workers(model, "CPU"), time.time() - 3, "+inf")


def test_a_pool_worker_serves_two_models_requests(tiers: Callable[..., Tiers]) -> None:
    t = tiers(TWO, OVQ_POOL_MEMORY_MB=BOTH_FIT)
    t.api()
    t.start("worker", "--pool", name="pool")
    wait_for(lambda: _up(t), 60, "the API is up")
    r, keys = t.redis(), t.keys
    with ThreadPoolExecutor(4) as ex:  # no worker of either yet: both wait for the pool to load them
        replies = list(ex.map(lambda m: chat(t, m, ignore_eos=True), [A, B, A, B]))
    for model, reply in zip([A, B, A, B], replies, strict=True):
        assert reply.status_code == 200, reply.text
        # Random weights can decode to an empty string (an early EOS, special tokens): count tokens instead.
        body = reply.json()
        assert body["model"] == model and body["usage"]["completion_tokens"] == 4, body
    # Both fit: both stay (the record is the pool's last tick's).
    record = wait_for(lambda: (p := pool_record(r, keys))["models"] == {A: "serving", B: "serving"} and p, 10,
                      "both models resident")
    assert record["unloads"] == "0"
    assert live(r, keys, A) == live(r, keys, B) == 1


def test_a_pool_worker_loads_the_model_with_waiting_work(tiers: Callable[..., Tiers]) -> None:
    """Room for one model: the pool loads what is waited for, and swaps when the other model's requests wait."""
    t = tiers(TWO, OVQ_POOL_MEMORY_MB=ONE_FITS, OVQ_POOL_MIN_RESIDENCY_S="1")
    t.api()
    t.start("worker", "--pool", name="pool")
    wait_for(lambda: _up(t), 60, "the API is up")
    r, keys = t.redis(), t.keys
    wait_for(lambda: pool_record(r, keys), 60, "the pool announced itself")
    time.sleep(2)
    assert pool_record(r, keys)["models"] == {}, "nothing waits: nothing is loaded"
    assert chat(t, B).status_code == 200
    wait_for(lambda: pool_record(r, keys)["models"] == {B: "serving"}, 10, "B resident alone")
    reply = chat(t, A)
    assert reply.status_code == 200, reply.text
    record = wait_for(lambda: (p := pool_record(r, keys))["models"] == {A: "serving"} and p, 30, "B swapped out")
    assert int(record["loads"]) == 2 and int(record["unloads"]) == 1, record
    assert live(r, keys, B) == 0


def test_an_idle_model_is_unloaded_after_its_keep_alive(tiers: Callable[..., Tiers]) -> None:
    """The setting keeps models five minutes; a request's own `keep_alive` (Ollama's field) says one second."""
    t = tiers(TWO, OVQ_POOL_MEMORY_MB=BOTH_FIT)
    t.api()
    t.start("worker", "--pool", name="pool")
    wait_for(lambda: _up(t), 60, "the API is up")
    r, keys = t.redis(), t.keys
    assert chat(t, A, keep_alive="1s").status_code == 200
    assert chat(t, B, keep_alive=-1).status_code == 200  # negative: kept for good
    wait_for(lambda: live(r, keys, A) == 0, 60, "A unloaded once idle for its keep_alive")
    wait_for(lambda: pool_record(r, keys)["models"] == {B: "serving"}, 10, "B resident alone")
    # Unloaded, its card stays: the next request waits for the pool to load it again.
    assert chat(t, A).status_code == 200
    assert live(r, keys, A) == 1


def test_a_bad_keep_alive_is_a_400(tiers: Callable[..., Tiers]) -> None:
    t = tiers(TWO, OVQ_QUEUE_TIMEOUT_S="5")  # accepted, it would wait for a worker no pool starts: a 503 soon
    t.api()
    wait_for(lambda: _up(t), 60, "the API is up")
    reply = chat(t, A, keep_alive="5 minutes")
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "keep_alive"


def _up(t: Tiers) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{t.port}/v2/health/live", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False



def test_a_pool_loads_a_model_whose_jobs_a_dead_worker_held(tiers: Callable[..., Tiers]) -> None:
    """A job of A is pending under a consumer that is dead (taken by a worker that died before it ran it), and no
    worker of A is live to reclaim it. The pool counts it as waiting, loads A, and A's hosted worker takes it over."""
    t = tiers(TWO, OVQ_POOL_MEMORY_MB=BOTH_FIT)
    r, keys = t.redis(), t.keys
    stream = keys.jobs(A, "CPU")
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    job = Job(model=A, device="CPU", kind="completion", prompt="a b", params=SamplingParams(max_tokens=3),
              reply_to="nobody")
    tx = r.pipeline(transaction=True)  # queued and taken at once: no worker could have had it
    tx.xadd(stream, job.to_fields())
    tx.xreadgroup(GROUP, "ghost", {stream: ">"}, count=1)
    tx.execute()
    t.start("worker", "--pool", name="pool")
    wait_for(lambda: r.hget(keys.job(job.id, A), "status") == b"done", 120, "the dead worker's job ran")
    assert pool_record(r, keys)["models"] == {A: "serving"}
