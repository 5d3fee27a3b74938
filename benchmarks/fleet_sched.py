#!/usr/bin/env python3
"""Scheduling scenarios for benchmarks/fleet.py (issue 26), each figure next to its baseline from the same run.

`SCENARIOS` maps a name to `async fn(base_url, model, api_key=None, boss_key=None) -> dict[str, float]`:
`base_url` ends in /v3 (or /v1); `boss_key` is a key allowed `max_priority: high`.

- `deadlines_under_overload`: a flood keeps the worker busy; requests whose deadline (X-Request-Timeout) the queue
  cannot meet are answered at once (429) instead of after their deadline (504, the old behaviour: its cost is the
  deadline itself, the baseline). Figures: refused share, p50 seconds to the answer, ratio to the deadline.
- `priorities_under_load`: under the same kind of flood, TTFT p50 of requests sent one at a time at priority
  `high` against the same requests at the default level, alternated.

- `flood_with_victim_tenant`: tenant A floods 200 requests at once, tenant B sends 10 streams at one a second,
  through an API with fair shares on and, in the same run against the same worker, through a second API with
  OVQ_FAIRNESS=0 (first come, first served): B's TTFT p50 under FIFO over fair (the gain), A's throughput fair
  over FIFO, and the most A jobs any B job waited behind (A jobs taken between its enqueue and its take, from the
  job hashes), each way. FIFO runs first (OVQ_SCHED_FAIR_FIRST=1: fair first).

Priorities and deadlines order and refuse only what waits in Redis: a worker whose admission empties the stream
into its engine leaves them nothing to act on (item 1 of issue 26), so the standalone run gives its one worker
max_num_seqs 1. Standalone (embedded Redis, that worker of SmolLM2-135M, one API with a YAML key file; name
scenarios to run only those):

  python benchmarks/fleet_sched.py [priorities_under_load ...]
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import redis as sync_redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import MODEL, free_port  # noqa: E402

from common.keys import Keys  # noqa: E402
from common.models.prepare import prepare  # noqa: E402
from common.models.sources import default_model  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402
from common.settings import Settings  # noqa: E402

FLOOD = 24
DEADLINE_S = 2.0
TENANT_FLOOD, VICTIMS = 200, 10
# Set by main() for flood_with_victim_tenant: the API with fair shares off, the Redis and key prefix of the stack.
FIFO_URL, REDIS_URL, PREFIX = "", "", "ovqsched"


def _headers(key: str | None, **extra: str) -> dict[str, str]:
    return {**({"Authorization": f"Bearer {key}"} if key else {}), **extra}


async def _flood(client: httpx.AsyncClient, base_url: str, model: str, key: str | None, n: int,
                 max_tokens: int = 96) -> list[asyncio.Task]:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True}
    tasks = [asyncio.ensure_future(client.post(f"{base_url}/completions", json=body, headers=_headers(key)))
             for _ in range(n)]
    await asyncio.sleep(2.0)  # the queue builds, and the model's rate is measured
    return tasks


async def _ttft(client: httpx.AsyncClient, base_url: str, model: str, headers: dict[str, str],
                **extra: object) -> float:
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "stream": True, **extra}
    sent = time.monotonic()
    async with client.stream("POST", f"{base_url}/completions", json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[5:])
                if any(choice.get("text") for choice in chunk.get("choices", [])):  # a token, not an empty chunk
                    return time.monotonic() - sent
    return time.monotonic() - sent


async def deadlines_under_overload(base_url: str, model: str, api_key: str | None = None,
                                   boss_key: str | None = None) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(3):  # the rate the wait estimate needs: jobs finished lately
            await client.post(f"{base_url}/completions", headers=_headers(api_key),
                              json={"model": model, "prompt": "Hi", "max_tokens": 16})
        flood = await _flood(client, base_url, model, api_key, FLOOD)
        answers, refused = [], 0
        for _ in range(8):
            sent = time.monotonic()
            reply = await client.post(f"{base_url}/completions",
                                      headers=_headers(api_key, **{"X-Request-Timeout": str(DEADLINE_S)}),
                                      json={"model": model, "prompt": "Hi", "max_tokens": 16})
            answers.append(time.monotonic() - sent)
            refused += reply.status_code == 429
            await asyncio.sleep(0.25)
        await asyncio.gather(*flood)
    p50 = statistics.median(answers)
    return {"refused_share": refused / len(answers), "answer_p50_s": p50, "deadline_s": DEADLINE_S,
            "answer_vs_waiting_out_the_deadline": p50 / DEADLINE_S}


async def priorities_under_load(base_url: str, model: str, api_key: str | None = None,
                                boss_key: str | None = None) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        flood = await _flood(client, base_url, model, api_key, FLOOD)
        probes = []
        for i in range(8):  # sent while the flood waits, alternating, each measured on its own
            if i % 2:
                probes.append(asyncio.ensure_future(_ttft(client, base_url, model, _headers(api_key))))
            else:
                probes.append(asyncio.ensure_future(_ttft(client, base_url, model, _headers(boss_key or api_key),
                                                          priority=-1)))
            await asyncio.sleep(0.25)
        ttfts = await asyncio.gather(*probes)
        high, default = ttfts[0::2], ttfts[1::2]
        flooded = await asyncio.gather(*flood)
    p50_high, p50_default = statistics.median(high), statistics.median(default)
    return {"ttft_p50_high_s": p50_high, "ttft_p50_default_s": p50_default, "high_vs_default": p50_high / p50_default,
            "flood_ok_share": sum(r.status_code == 200 for r in flooded) / len(flooded)}


async def _tenant_run(base_url: str, model: str, run: str) -> tuple[float, float, int]:
    """One flood of tenant A with tenant B's streams: (B's TTFT p50, A's jobs per second, most A jobs one B job
    waited behind)."""
    limits = httpx.Limits(max_connections=TENANT_FLOOD + VICTIMS + 8)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True}
        started = time.monotonic()
        flood = [asyncio.ensure_future(client.post(f"{base_url}/completions", json=body,
                                                   headers=_headers("sk-a", **{"X-Request-Id": f"{run}-a-{n}"})))
                 for n in range(TENANT_FLOOD)]
        await asyncio.sleep(1.0)  # the flood is queued
        probes = []
        for n in range(VICTIMS):
            probes.append(asyncio.ensure_future(_ttft(client, base_url, model,
                                                      _headers("sk-b", **{"X-Request-Id": f"{run}-b-{n}"}))))
            await asyncio.sleep(1.0)
        ttfts = await asyncio.gather(*probes)
        answers = await asyncio.gather(*flood)
        elapsed = time.monotonic() - started
    assert all(r.status_code == 200 for r in answers), {r.status_code for r in answers}
    r = sync_redis.Redis.from_url(REDIS_URL)
    keys = Keys(PREFIX)

    def times(rid: str) -> tuple[float, float]:
        created, taken = r.hmget(keys.job(rid), "created", "taken")
        return float(created), float(taken)

    flood_taken = [times(f"{run}-a-{n}")[1] for n in range(TENANT_FLOOD)]
    behind = max(sum(created < t < taken for t in flood_taken)
                 for created, taken in (times(f"{run}-b-{n}") for n in range(VICTIMS)))
    return statistics.median(ttfts), TENANT_FLOOD / elapsed, behind


async def flood_with_victim_tenant(base_url: str, model: str, api_key: str | None = None,
                                   boss_key: str | None = None) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=60) as client:  # warm: the first request pays compilation
        await client.post(f"{base_url}/completions", headers=_headers("sk-a"),
                          json={"model": model, "prompt": "Hi", "max_tokens": 4})
    if os.environ.get("OVQ_SCHED_FAIR_FIRST"):  # the other order, to see what the machine's drift does
        fair_ttft, fair_rate, fair_behind = await _tenant_run(base_url, model, "fair")
        fifo_ttft, fifo_rate, fifo_behind = await _tenant_run(FIFO_URL, model, "fifo")
    else:
        fifo_ttft, fifo_rate, fifo_behind = await _tenant_run(FIFO_URL, model, "fifo")
        fair_ttft, fair_rate, fair_behind = await _tenant_run(base_url, model, "fair")
    return {"b_ttft_p50_fifo_s": fifo_ttft, "b_ttft_p50_fair_s": fair_ttft, "b_ttft_gain": fifo_ttft / fair_ttft,
            "a_rate_fair_vs_fifo": fair_rate / fifo_rate, "b_max_a_jobs_ahead_fifo": fifo_behind,
            "b_max_a_jobs_ahead_fair": fair_behind}


SCENARIOS: dict[str, Callable[..., Awaitable[dict[str, float]]]] = {
    "deadlines_under_overload": deadlines_under_overload,
    "priorities_under_load": priorities_under_load,
    "flood_with_victim_tenant": flood_with_victim_tenant,
}


def main() -> int:
    model_dir = prepare(default_model(Settings()))
    work = Path(tempfile.mkdtemp(prefix="ovq-fleet-sched-"))
    redis = EmbeddedRedis(work / "redis", port=free_port())
    url = redis.start()
    config = work / "models.json"
    config.write_text(json.dumps({"models": {MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 1}}}))
    (work / "keys.yaml").write_text("keys:\n  - {key: sk-boss, tenant: ops, max_priority: high}\n"
                                    "  - {key: sk-bench, tenant: bench}\n  - {key: sk-a, tenant: a}\n"
                                    "  - {key: sk-b, tenant: b}\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "REDIS_URL": url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(port), "OVQ_LOG_LEVEL": "warning",
           "OVQ_KEY_PREFIX": "ovqsched", "OVQ_API_PROCESSES": "1", "OVQ_API_KEY_FILE": str(work / "keys.yaml"),
           "PYTHONPATH": str(ROOT), "OVQ_QUEUE_TIMEOUT_S": "900"}
    fifo_port = free_port()
    global FIFO_URL, REDIS_URL
    FIFO_URL, REDIS_URL = f"http://127.0.0.1:{fifo_port}/v3", url
    procs = [subprocess.Popen([sys.executable, "-m", *a], env=env, cwd=ROOT)
             for a in (["workers", "--model", MODEL], ["api"])]
    # A second API on the same Redis and worker, with fair shares off: flood_with_victim_tenant's baseline.
    procs.append(subprocess.Popen([sys.executable, "-m", "api"], env={**env, "OVQ_PORT": str(fifo_port),
                                                                      "OVQ_FAIRNESS": "0"}, cwd=ROOT))
    try:
        until = time.monotonic() + 180
        while True:
            try:
                if all(httpx.get(f"http://127.0.0.1:{p}/v2/models/{MODEL}/ready", timeout=2).status_code == 200
                       for p in (port, fifo_port)):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > until:
                raise RuntimeError("the stack did not start")
            time.sleep(0.5)
        chosen = sys.argv[1:] or list(SCENARIOS)
        for name, scenario in SCENARIOS.items():
            if name not in chosen:
                continue
            figures = asyncio.run(scenario(f"{base}/v3", MODEL, "sk-bench", "sk-boss"))
            print(name, " ".join(f"{k}={v:.3f}" for k, v in figures.items()), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
