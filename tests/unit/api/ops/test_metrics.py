"""api/ops/metrics.py: what a finished request adds, and a retired model's series going and coming back."""
from __future__ import annotations

from prometheus_client import generate_latest

from api.ops.metrics import Metrics, Record
from common.keys import Keys
from common.ops.stats import BOUNDS


def metrics() -> Metrics:
    return Metrics(None, Keys("ovq"), worker_ttl_s=15)  # type: ignore[arg-type]  # no Redis: nothing is served


def finished(model: str, completion: int) -> Record:
    record = Record("/v3/chat/completions", model=model, device="CPU", completion_tokens=completion,
                    prompt_tokens=3, ttft_ms=20.0, queue_ms=1.0)
    record.itl_ms = 2.0
    return record


def sample(m: Metrics, name: str, model: str) -> float | None:
    return m.registry.get_sample_value(name, {"model": model, "device": "CPU"})


def test_a_finished_request_counts_into_its_models_series() -> None:
    m = metrics()
    m.finish(finished("a", 5))
    m.finish(finished("a", 7))
    m.finish(finished("b", 1))
    assert sample(m, "ovq_generation_tokens_total", "a") == 12
    assert sample(m, "ovq_prompt_tokens_total", "a") == 6
    assert sample(m, "ovq_time_to_first_token_seconds_count", "a") == 2
    assert sample(m, "ovq_inter_token_latency_seconds_sum", "a") == 0.004
    assert sample(m, "ovq_generation_tokens_total", "b") == 1


async def test_a_retired_models_series_go_and_a_later_request_brings_them_back() -> None:
    m = metrics()
    m.finish(finished("a", 5))
    await m.render({})  # "a" is no longer announced
    assert b'model="a"' not in generate_latest(m.registry)
    m.finish(finished("a", 4))  # served again: counted from zero, in series the registry exports
    assert sample(m, "ovq_generation_tokens_total", "a") == 4
    assert sample(m, "ovq_queue_time_seconds_count", "a") == 1


def test_a_12_ms_inter_token_latency_lands_in_a_bucket_a_few_ms_wide() -> None:
    """The exported `le` bounds are the ops page's (common/ops/stats.py), fine where served latencies sit."""
    m = metrics()
    record = finished("a", 5)
    record.itl_ms = 12.0
    m.finish(record)

    def bucket(le: str) -> float | None:
        return m.registry.get_sample_value("ovq_inter_token_latency_seconds_bucket",
                                           {"model": "a", "device": "CPU", "le": le})

    assert bucket("0.01") == 0 and bucket("0.0125") == 1
    text = generate_latest(m.registry).decode()
    bounds = {line.split('le="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("ovq_inter_token_latency_seconds_bucket{") and 'model="a"' in line}
    assert {float(b) for b in bounds if b != "+Inf"} == {ms / 1000 for ms in BOUNDS["itl"]}


async def test_waiting_jobs_per_priority_and_refusals_by_reason(redis_url: str) -> None:
    import time

    import redis.asyncio as aioredis

    from common.keys import GROUP

    keys = Keys(f"metrics{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    m = Metrics(redis, keys, worker_ttl_s=15)
    for level, n in (("high", 1), ("interactive", 3), ("low", 2)):
        stream = keys.level_jobs("m", "CPU", level)
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        for _ in range(n):
            await redis.xadd(stream, {"job": "x"})
    await redis.xreadgroup(GROUP, "w", {keys.jobs("m", "CPU"): ">"}, count=1)  # running, not waiting
    await redis.zadd(keys.affinity_owners("m", "CPU"), {"w1": time.time()})  # prefix affinity: w1's stream
    affine = keys.affinity_jobs("m", "CPU", "w1")
    await redis.xgroup_create(affine, GROUP, id="0", mkstream=True)
    for _ in range(3):
        await redis.xadd(affine, {"job": "x"})
    await redis.xreadgroup(GROUP, "w1", {affine: ">"}, count=1)
    m.refused("m", "deadline")
    m.refused("m", "deadline")
    await m.render({"m": ["CPU"]})
    waiting = {level: m.registry.get_sample_value("ovq_queue_waiting_jobs_by_priority",
                                                  {"model": "m", "device": "CPU", "priority": level})
               for level in ("high", "interactive", "low", "batch")}
    assert waiting == {"high": 1, "interactive": 4, "low": 2, "batch": 0}, "the affinity stream's 2 waiting too"
    labels = {"model": "m", "device": "CPU"}
    assert m.registry.get_sample_value("ovq_queue_waiting_jobs", labels) == 4
    assert m.registry.get_sample_value("ovq_queue_waiting_jobs_affinity", labels) == 2
    assert m.registry.get_sample_value("ovq_refusals_total", {"model": "m", "reason": "deadline"}) == 2
    await redis.aclose()
