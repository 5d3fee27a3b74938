#!/usr/bin/env python3
"""Priorities and fair shares on affinity streams (issue 40, item 7): two simulated workers behind the real tiers.

Tenant A runs `--flood` closed-loop streams (each sends its next request when its last ends), tenant B sends
`--victims` streams one every `--every` seconds, and tenant C one low-priority request (`priority: 1`) at the start,
with fair shares and prefix affinity on and priority aging at `--aging` seconds. Two arms alternate (pinned,
unpinned, unpinned, pinned, ...): in the pinned arm every A request carries one `prompt_cache_key`, so its flood
is pinned to the worker that served that conversation; in the unpinned arm none does. Each arm prints B's TTFT
p50, the most A jobs a B job waited behind and the most of those queued after it (job hashes), the low-priority
request's TTFT, and, sampled while the flood runs, the jobs waiting in Redis (job hashes still `queued`) beside
`ovq_queue_waiting_jobs_by_priority` (what dashboards read). Then pinned over unpinned per round: where
affinity kept its fair shares and priorities, about 1. A B or low request with no first token after `--bound`
seconds (60) counts as that many (its stream is dropped).

  python benchmarks/fleet_tenants.py [--rounds 2] [--flood 16] [--tokens 48] [--seqs 2]

The workers are hollow (benchmarks/fleetsim: real I/O halves, a simulated engine with SmolLM2's step profile), so
the figures are the scheduler's, not the engine's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from fleet_scale import MODEL, Stack  # noqa: E402

KEYS = "keys:\n  - {key: sk-a, tenant: a}\n  - {key: sk-b, tenant: b}\n  - {key: sk-c, tenant: c}\n"


@dataclass(frozen=True)
class Arm:
    pinned: bool
    b_ttft_p50_s: float
    low_ttft_s: float
    b_behind: int  # the most A jobs one B job waited behind (taken between its enqueue and its take)
    b_passed: int  # the most of those queued after it
    waiting: float  # mean over the samples: the run's jobs waiting in Redis (job hashes still `queued`)
    gauge: float  # and what ovq_queue_waiting_jobs_by_priority showed, summed over levels

    def line(self) -> str:
        return (f"{'pinned' if self.pinned else 'unpinned':8}: B TTFT p50 {self.b_ttft_p50_s:.2f} s, most A jobs "
                f"ahead of a B job {self.b_behind} (queued after it: {self.b_passed}), low-priority TTFT "
                f"{self.low_ttft_s:.2f} s; jobs waiting {self.waiting:.1f}, the gauge {self.gauge:.1f} (means of "
                "samples)")


async def ttft(client: httpx.AsyncClient, url: str, key: str, rid: str, tokens: int, **extra: object) -> float:
    """Seconds to the first token of a streamed chat (request id `rid`, its job's), read to its end."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": tokens,
            "stream": True, **extra}
    sent, first = time.monotonic(), None
    async with client.stream("POST", f"{url}/v3/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}", "X-Request-Id": rid}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data:") and '"content"' in line:
                first = time.monotonic() - sent
    return first if first is not None else time.monotonic() - sent


async def bounded(waited: Awaitable[float], bound: float) -> float:
    """The request's TTFT, or `bound` when it has had none by then (its stream is dropped: starved)."""
    try:
        return await asyncio.wait_for(waited, bound)
    except TimeoutError:
        return bound


def waiting_jobs(stack: Stack, run: str) -> int:
    """The run's jobs not yet taken by a worker, from their hashes (the truth the gauge should show)."""
    r, n = stack.redis, 0
    for key in r.scan_iter(match=f"{stack.keys.job(run)}-*", count=1000):
        if r.hget(key, "status") == b"queued":
            n += 1
    return n


async def gauge(client: httpx.AsyncClient, url: str) -> int:
    """Jobs waiting at every level, as the API's metrics show them."""
    text = (await client.get(f"{url}/metrics", headers={"Authorization": "Bearer sk-admin"})).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("ovq_queue_waiting_jobs_by_priority{")))


def ahead_and_passed(stack: Stack, run: str, a_jobs: int, victims: int) -> tuple[int, int]:
    """The most A jobs any B job waited behind (taken between its enqueue and its take), and the most of those that
    were queued after it (passed it), from the job hashes. A B job that never started counts until the end."""
    r = stack.redis

    def times(rid: str) -> tuple[float, float]:
        created, taken = r.hmget(stack.keys.job(rid), "created", "taken")
        return float(created or 0), float(taken or "inf")

    a = [times(f"{run}-a-{n}") for n in range(a_jobs)]
    b = [times(f"{run}-b-{n}") for n in range(victims)]
    ahead = max(sum(created < t < taken for _, t in a) for created, taken in b)
    passed = max(sum(created < c and t < taken for c, t in a) for created, taken in b)
    return ahead, passed


async def arm(stack: Stack, run: str, pinned: bool, args: argparse.Namespace) -> Arm:
    url = f"http://127.0.0.1:{stack.port}"
    stop = asyncio.Event()
    sent = 0
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=args.flood + 32)) as client:
        async def flood() -> None:
            nonlocal sent
            extra = {"prompt_cache_key": "a-conversation"} if pinned else {}
            while not stop.is_set():
                sent += 1
                await ttft(client, url, "sk-a", f"{run}-a-{sent - 1}", args.tokens, **extra)

        loops = [asyncio.create_task(flood()) for _ in range(args.flood)]
        await asyncio.sleep(args.every * 4)  # the flood fills the queue
        low = asyncio.create_task(bounded(ttft(client, url, "sk-c", f"{run}-c", args.tokens, priority=1), args.bound))
        truths, shown = [], []
        victims = []
        for n in range(args.victims):
            victims.append(asyncio.create_task(bounded(ttft(client, url, "sk-b", f"{run}-b-{n}", args.tokens),
                                                       args.bound)))
            shown.append(await gauge(client, url))
            truths.append(await asyncio.to_thread(waiting_jobs, stack, run))
            await asyncio.sleep(args.every)
        b = await asyncio.gather(*victims)
        low_s = await low
        stop.set()
        await asyncio.gather(*loops)
    return Arm(pinned, statistics.median(b), low_s, *ahead_and_passed(stack, run, sent, args.victims),
               statistics.fmean(truths), statistics.fmean(shown))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="pinned/unpinned pairs")
    parser.add_argument("--flood", type=int, default=16, help="A's closed-loop streams")
    parser.add_argument("--victims", type=int, default=10, help="B's streams")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between B's streams")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seqs", type=int, default=2, help="max_num_seqs of each worker")
    parser.add_argument("--aging", type=float, default=2.0, help="OVQ_PRIORITY_AGING_S")
    parser.add_argument("--profile", default="smollm2")
    parser.add_argument("--bound", type=float, default=60.0, help="seconds a B or low request waits at most")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys.yaml").write_text(KEYS)
        env = {"OVQ_AFFINITY": "true", "OVQ_API_KEY_FILE": str(Path(tmp) / "keys.yaml"), "OVQ_ADMIN_KEYS": "sk-admin",
               "OVQ_PRIORITY_AGING_S": str(args.aging), "OVQ_QUEUE_TIMEOUT_S": "600"}
        stack = Stack(Path(tmp), 2, 1, 2, args.profile, args.seqs, env)
        try:
            arms: list[Arm] = []
            for n in range(args.rounds):
                for pinned in (True, False) if n % 2 == 0 else (False, True):
                    arms.append(asyncio.run(arm(stack, f"r{n}{'p' if pinned else 'u'}", pinned, args)))
                    print(arms[-1].line(), flush=True)
        finally:
            stack.stop()
    pairs = [{a.pinned: a for a in arms[2 * n:2 * n + 2]} for n in range(args.rounds)]
    b = [p[True].b_ttft_p50_s / p[False].b_ttft_p50_s for p in pairs]
    low = [p[True].low_ttft_s / p[False].low_ttft_s for p in pairs]
    print("B's TTFT p50 pinned / unpinned per round: " + " ".join(f"{x:.2f}" for x in b))
    print("low-priority TTFT pinned / unpinned per round: " + " ".join(f"{x:.2f}" for x in low))
    print(json.dumps({"b_ttft_pinned_over_unpinned": statistics.fmean(b),
                      "low_ttft_pinned_over_unpinned": statistics.fmean(low),
                      "b_behind_pinned": max(a.b_behind for a in arms if a.pinned),
                      "b_behind_unpinned": max(a.b_behind for a in arms if not a.pinned),
                      "b_passed_pinned": max(a.b_passed for a in arms if a.pinned),
                      "b_passed_unpinned": max(a.b_passed for a in arms if not a.pinned),
                      "waiting": statistics.fmean(a.waiting for a in arms),
                      "gauge": statistics.fmean(a.gauge for a in arms)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
