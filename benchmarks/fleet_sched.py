#!/usr/bin/env python3
"""Scheduling scenarios for benchmarks/fleet.py (issue 26), each figure next to its baseline from the same run.

`SCENARIOS` maps a name to `async fn(base_url, model, api_key=None, boss_key=None) -> dict[str, float]`:
`base_url` ends in /v3 (or /v1); `boss_key` is a key allowed `max_priority: high`.

- `deadlines_under_overload`: a flood keeps the worker busy; requests whose deadline (X-Request-Timeout) the queue
  cannot meet are answered at once (429) instead of after their deadline. The baseline, measured beside them (sent
  alternately, under the same flood): the same requests with the deadline kept by the client alone (no header: the
  server cannot act on it), which learns of it when it passes. Figures: refused share, p50 seconds to the answer
  told and untold, their ratio, and the share of untold requests that ran out their deadline.
- `priorities_under_load`: under the same kind of flood, TTFT p50 of requests sent one at a time at priority
  `high` against the same requests at the default level, alternated.

- `flood_with_victim_tenant`: tenant A floods `--flood` (200) requests of `--a-tokens` (32) tokens at once,
  tenant B sends 10 streams at one a second, through an API with fair shares on and, against the same worker,
  through a second API with OVQ_FAIRNESS=0 (first come, first served): `--rounds` (2) pairs of halves, alternated
  FIFO, fair, fair, FIFO, ... so that a drift of the machine weighs on both arms alike. Each half prints A's
  throughput (its generated tokens over its makespan: first request sent to last answer), B's TTFT p50, the most
  A jobs any B job waited behind (A jobs taken between its enqueue and its take, from the job hashes), and the
  worker's busy share of A's makespan with the mean gap from a job's end to its next take (from each job's
  `taken` and `created + total_ms`: is the worker ever idle while jobs wait?). Then, per round, A's throughput
  fair over FIFO (mean and spread: max - min) and B's TTFT p50 FIFO over fair. (Under FIFO B's 10 short jobs run
  after A's last, outside A's makespan; fair, inside it: about 1 % of A's work at the defaults.)

Priorities and deadlines order and refuse only what waits in Redis: a worker whose admission empties the stream
into its engine leaves them nothing to act on (item 1 of issue 26), so the standalone run gives its one worker
max_num_seqs 1. Standalone (embedded Redis, that worker of SmolLM2-135M, one API with a YAML key file; name
scenarios to run only those):

  python benchmarks/fleet_sched.py [priorities_under_load ...] [--rounds 2] [--a-tokens 32] [--flood 200]

The fair-share proof alone: `python benchmarks/fleet_sched.py flood_with_victim_tenant` (on an idle 2-core machine
each half about 1.5 min, about 7 min in all).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
TENANT_FLOOD, VICTIMS = 200, 10  # flood_with_victim_tenant: A's requests, B's (--flood sets A's)
A_TOKENS = 32  # tokens each of A's requests generates (--a-tokens)
ROUNDS = 2  # pairs of halves, FIFO and fair, alternated (--rounds)
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
                to_end: bool = False, **extra: object) -> float:
    """Seconds to the first token; `to_end`: the stream is read to its end (else dropped: its job cancelled)."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "stream": True, **extra}
    sent, first = time.monotonic(), None
    async with client.stream("POST", f"{base_url}/completions", json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[5:])
                if any(choice.get("text") for choice in chunk.get("choices", [])):  # a token, not an empty chunk
                    first = time.monotonic() - sent
                    if not to_end:
                        return first
    return first if first is not None else time.monotonic() - sent


async def _answer_s(client: httpx.AsyncClient, base_url: str, model: str, key: str | None,
                    told: bool) -> tuple[float, int | None]:
    """Seconds to a short request's answer and its status, with a deadline of DEADLINE_S: `told`, the server knows
    it (X-Request-Timeout); else the client keeps it alone and gives up when it passes (status None; the server
    sees the client leave and drops the job)."""
    extra = {"X-Request-Timeout": str(DEADLINE_S)} if told else {}
    sent = time.monotonic()
    try:
        reply = await asyncio.wait_for(client.post(f"{base_url}/completions", headers=_headers(key, **extra),
                                                   json={"model": model, "prompt": "Hi", "max_tokens": 16}),
                                       None if told else DEADLINE_S)
    except TimeoutError:
        return time.monotonic() - sent, None
    return time.monotonic() - sent, reply.status_code


async def deadlines_under_overload(base_url: str, model: str, api_key: str | None = None,
                                   boss_key: str | None = None) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(3):  # the rate the wait estimate needs: jobs finished lately
            await client.post(f"{base_url}/completions", headers=_headers(api_key),
                              json={"model": model, "prompt": "Hi", "max_tokens": 16})
        flood = await _flood(client, base_url, model, api_key, FLOOD)
        probes = []
        for i in range(16):  # told and untold alternated, 8 of each, while the flood waits
            probes.append(asyncio.ensure_future(_answer_s(client, base_url, model, api_key, told=i % 2 == 0)))
            await asyncio.sleep(0.25)
        answers = await asyncio.gather(*probes)
        await asyncio.gather(*flood)
    told, untold = answers[0::2], answers[1::2]
    return deadline_figures(told, untold)


def deadline_figures(told: list[tuple[float, int | None]], untold: list[tuple[float, int | None]]) -> dict[str, float]:
    """The told requests' refused share and p50 seconds to the answer, against the untold ones' (the baseline)."""
    p50, baseline = statistics.median(s for s, _ in told), statistics.median(s for s, _ in untold)
    return {"refused_share": sum(status == 429 for _, status in told) / len(told), "answer_p50_s": p50,
            "untold_answer_p50_s": baseline, "answer_vs_untold": p50 / baseline,
            "untold_ran_out_share": sum(status is None for _, status in untold) / len(untold),
            "deadline_s": DEADLINE_S}


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


@dataclass(frozen=True)
class Half:
    """One flood of tenant A with tenant B's streams, through one API (fair shares on or off)."""

    arm: str  # "fifo" or "fair"
    b_ttft_p50_s: float
    a_tokens: int  # generated for A
    a_makespan_s: float  # from A's first request sent to its last answer
    b_behind: int  # the most A jobs one B job waited behind (taken between its enqueue and its take)
    busy_share: float  # of A's makespan, the share the worker ran a job (its one sequence): work conservation
    gap_ms: float  # mean time from a job's end to the worker's next take, within A's makespan

    @property
    def a_rate(self) -> float:
        return self.a_tokens / self.a_makespan_s

    def line(self, n: int) -> str:
        return (f"half {n} {self.arm:4}: A {self.a_tokens} tokens in {self.a_makespan_s:.1f} s = {self.a_rate:.1f} "
                f"tokens/s; B TTFT p50 {self.b_ttft_p50_s:.2f} s; most A jobs a B job waited behind "
                f"{self.b_behind}; worker busy {self.busy_share:.1%} of A's makespan, {self.gap_ms:.1f} ms from a "
                "job's end to the next take")


def _busy(spans: list[tuple[float, float]], since: float, until: float) -> tuple[float, float]:
    """The worker's busy share of [since, until] and its mean gap (ms) between one job's end and the next take,
    from each job's (taken, ended): its one sequence runs one job at a time."""
    busy, gaps, last_end = 0.0, [], None
    for taken, ended in sorted(spans):
        taken, ended = max(taken, since), min(ended, until)
        if ended <= taken:
            continue
        if last_end is not None:
            gaps.append(max(0.0, taken - last_end))
        start = taken if last_end is None else max(taken, last_end)
        busy += max(0.0, ended - start)
        last_end = ended if last_end is None else max(last_end, ended)
    return busy / (until - since), 1000 * statistics.fmean(gaps) if gaps else 0.0


async def _tenant_run(base_url: str, model: str, run: str, arm: str) -> Half:
    limits = httpx.Limits(max_connections=TENANT_FLOOD + VICTIMS + 8)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": A_TOKENS, "ignore_eos": True}

        async def flood_one(n: int) -> tuple[httpx.Response, float]:
            response = await client.post(f"{base_url}/completions", json=body,
                                         headers=_headers("sk-a", **{"X-Request-Id": f"{run}-a-{n}"}))
            return response, time.monotonic()

        started = time.monotonic()
        flood = [asyncio.ensure_future(flood_one(n)) for n in range(TENANT_FLOOD)]
        await asyncio.sleep(1.0)  # the flood is queued
        probes = []
        for n in range(VICTIMS):
            probes.append(asyncio.ensure_future(_ttft(client, base_url, model,
                                                      _headers("sk-b", **{"X-Request-Id": f"{run}-b-{n}"}),
                                                      to_end=True)))
            await asyncio.sleep(1.0)
        ttfts = await asyncio.gather(*probes)
        answers = await asyncio.gather(*flood)
    assert all(r.status_code == 200 for r, _ in answers), {r.status_code for r, _ in answers}
    a_tokens = sum(r.json()["usage"]["completion_tokens"] for r, _ in answers)
    makespan = max(at for _, at in answers) - started
    r = sync_redis.Redis.from_url(REDIS_URL)
    keys = Keys(PREFIX)

    def times(rid: str) -> tuple[float, float, float]:
        created, taken, total_ms = r.hmget(keys.job(rid), "created", "taken", "total_ms")
        return float(created), float(taken), float(created) + float(total_ms) / 1000

    flood_times = [times(f"{run}-a-{n}") for n in range(TENANT_FLOOD)]
    victim_times = [times(f"{run}-b-{n}") for n in range(VICTIMS)]
    behind = max(sum(created < t < taken for _, t, _ in flood_times) for created, taken, _ in victim_times)
    since, until = min(c for c, _, _ in flood_times), max(e for _, _, e in flood_times)
    busy, gap_ms = _busy([(t, e) for _, t, e in flood_times + victim_times], since, until)
    return Half(arm, statistics.median(ttfts), a_tokens, makespan, behind, busy, gap_ms)


async def flood_with_victim_tenant(base_url: str, model: str, api_key: str | None = None,
                                   boss_key: str | None = None) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=120) as client:  # warm: the first request pays compilation
        for url in (base_url, FIFO_URL):
            await client.post(f"{url}/completions", headers=_headers("sk-a"),
                              json={"model": model, "prompt": "Hi", "max_tokens": 4})
    halves: list[Half] = []
    for n in range(ROUNDS):  # FIFO, fair, fair, FIFO, ...: a drift of the machine weighs on both arms alike
        for arm in ("fifo", "fair") if n % 2 == 0 else ("fair", "fifo"):
            half = await _tenant_run(FIFO_URL if arm == "fifo" else base_url, model, f"r{n}-{arm}", arm)
            halves.append(half)
            print(half.line(len(halves)), flush=True)
    pairs = [(halves[2 * n], halves[2 * n + 1]) for n in range(ROUNDS)]
    by_arm = [{h.arm: h for h in pair} for pair in pairs]
    rates = [p["fair"].a_rate / p["fifo"].a_rate for p in by_arm]
    gains = [p["fifo"].b_ttft_p50_s / p["fair"].b_ttft_p50_s for p in by_arm]
    print("A's throughput fair / FIFO per round: " + " ".join(f"{x:.3f}" for x in rates)
          + f"; mean {statistics.fmean(rates):.3f}, spread {max(rates) - min(rates):.3f}", flush=True)
    print("B's TTFT p50 FIFO / fair per round: " + " ".join(f"{x:.1f}" for x in gains), flush=True)
    arms = {arm: [h for h in halves if h.arm == arm] for arm in ("fifo", "fair")}
    return {"a_rate_fair_vs_fifo": statistics.fmean(rates), "a_rate_ratio_spread": max(rates) - min(rates),
            "b_ttft_gain": statistics.fmean(gains), "b_ttft_gain_min": min(gains),
            "b_max_a_jobs_ahead_fifo": max(h.b_behind for h in arms["fifo"]),
            "b_max_a_jobs_ahead_fair": max(h.b_behind for h in arms["fair"]),
            "worker_busy_fifo": statistics.fmean(h.busy_share for h in arms["fifo"]),
            "worker_busy_fair": statistics.fmean(h.busy_share for h in arms["fair"]),
            "gap_ms_fifo": statistics.fmean(h.gap_ms for h in arms["fifo"]),
            "gap_ms_fair": statistics.fmean(h.gap_ms for h in arms["fair"])}


SCENARIOS: dict[str, Callable[..., Awaitable[dict[str, float]]]] = {
    "deadlines_under_overload": deadlines_under_overload,
    "priorities_under_load": priorities_under_load,
    "flood_with_victim_tenant": flood_with_victim_tenant,
}


def main() -> int:
    global ROUNDS, A_TOKENS, TENANT_FLOOD
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", help=f"of: {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="flood_with_victim_tenant: FIFO/fair pairs")
    parser.add_argument("--a-tokens", type=int, default=A_TOKENS, help="flood_with_victim_tenant: A's max_tokens")
    parser.add_argument("--flood", type=int, default=TENANT_FLOOD, help="flood_with_victim_tenant: A's requests")
    args = parser.parse_args()
    chosen = args.scenarios or list(SCENARIOS)
    if unknown := [n for n in chosen if n not in SCENARIOS]:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    ROUNDS, A_TOKENS, TENANT_FLOOD = args.rounds, args.a_tokens, args.flood
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
           "PYTHONPATH": str(ROOT), "OVQ_QUEUE_TIMEOUT_S": "3600"}
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
        print(f"# load average at start: {os.getloadavg()}", flush=True)
        for name, scenario in SCENARIOS.items():
            if name not in chosen:
                continue
            t0 = time.monotonic()
            figures = asyncio.run(scenario(f"{base}/v3", MODEL, "sk-bench", "sk-boss"))
            print(name, " ".join(f"{k}={v:.3f}" for k, v in figures.items()), flush=True)
            print(f"# {name}: {time.monotonic() - t0:.0f} s; load average {os.getloadavg()}", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
