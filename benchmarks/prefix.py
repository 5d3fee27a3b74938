#!/usr/bin/env python3
"""Prefix affinity, measured: a shared-prefix chat load against SmolLM2 workers with `enable_prefix_caching`, with
affinity on and off in the same run, in alternating phases (the machine is shared and noisy: only ratios from one
run mean anything).

The load: `--conversations` closed-loop clients, each a conversation whose history grows turn by turn (a long
system prompt all share, then its own user turns of a few hundred characters and the model's short answers), a new
conversation once one reaches `--turns`. Both arms are the same model directory under two names, each served by
`--workers` workers: `affine` by workers with OVQ_AFFINITY on, through an API process with it on, `plain` by
workers with it off, through a second API process with it off (so the uniform load measures the API's digests and
lookups too). One arm at a time is loaded; the other's workers sit idle on their blocking reads.

Printed per arm: TTFT p50/p90 (ms), requests/s and generated tokens/s, the share of jobs run from their own
affinity stream (hits: GenAI 2026.4 reports no prefix-cache hit count, so this is the worker's own count of jobs it
ran where its cache most likely held the prefix), jobs stolen, and the longest wait in a queue (`queue_ms` of the
jobs), and the jobs that waited longer than the steal threshold while a worker of the arm ran nothing (for more
than `--idle-slack-ms` of that time: a worker's wake-up is not instant) with the longest such idle time: what "no job
waits longer than the threshold while a worker is idle" must keep at 0 (from the job hashes: when each job was
queued, taken, last written, and by which worker). Where a job's TTFT went: its queue wait (`queue_p50/p90`) and
the time from being taken to its first token (`served_p50/p90`: admission, prefill of what was not cached, the
steps it shared), the mean prompt size and the busiest worker's share of the jobs. Then the same for a uniform load
(every prompt different, no shared prefix; `--uniform-rounds` of `--uniform-phase-s`, more than the shared load: its
ratio is affinity's cost). Several `--steal-ms` values (100,250,500,1000) run one affinity arm per threshold.

Each engine has a KV cache of `--cache-gb` (1 GB): with 0 (grow as needed) GenAI keeps the cache only as big as the
running sequences needed, so the next few other prompts an engine runs evict a conversation's history before its
next turn, wherever that turn is routed (one engine, 4 conversations interleaved: turn 4 took 3 steps to its first
token with 0 and 1 step with 1 GB).

  python benchmarks/prefix.py                 # 2 workers per arm, 2 rounds of 60 s phases
  python benchmarks/prefix.py --workers 4 --phase-s 45 --rounds 1 --no-uniform
  python benchmarks/prefix.py --steal-ms 100,250,500,1000 --phase-s 30 --uniform-rounds 2 --uniform-phase-s 30
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fleet import SMOLLM2, Fleet  # noqa: E402
from serving import free_port, pct  # noqa: E402
from sse_client import Connection, Result  # noqa: E402

from common.jobs import JobHash  # noqa: E402

WORDS = ("shelf", "catalogue", "atlas", "periodical", "manuscript", "archive", "index", "reading room", "folio",
         "microfilm", "loan", "reference", "rare book", "map", "journal", "thesis")
SYSTEM = ("You are the help desk of a large research library. The following house rules apply to every answer. "
          + " ".join(f"Rule {i}: a visitor asking about the {WORDS[i % len(WORDS)]} collection is sent to floor "
                     f"{i % 7} and told the opening hours of desk {i}." for i in range(40)))


def user_turn(rng: random.Random) -> str:
    """A few hundred characters of a visitor's question: distinct per conversation and turn."""
    return " ".join(f"I look for the {rng.choice(WORDS)} number {rng.randrange(10_000)}." for _ in range(12))


@dataclass
class Arm:
    results: list[Result] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    wall: float = 0.0


async def conversation_loop(port: int, model: str, arm: Arm, until: float, turns: int, max_tokens: int,
                            seed: int, shared: bool) -> None:
    """One closed-loop client: a conversation's turns one after another, a new conversation after `turns`."""
    rng = random.Random(seed)
    connection = Connection("127.0.0.1", port)
    try:
        while time.perf_counter() < until:
            messages = [{"role": "system", "content": SYSTEM if shared else user_turn(rng) * 3}]
            for _ in range(turns if shared else 1):
                if time.perf_counter() >= until:
                    return
                messages.append({"role": "user", "content": user_turn(rng)})
                rid = uuid.uuid4().hex
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
                try:
                    result = await connection.stream("/v3/chat/completions", body, {"X-Request-Id": rid})
                except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                    result = Result(error=repr(exc))
                    connection.close()
                    connection = Connection("127.0.0.1", port)
                arm.results.append(result)
                arm.jobs.append(rid)
                if not result.ok:
                    break
                messages.append({"role": "assistant", "content": f"Go to floor {rng.randrange(7)}."})
    finally:
        connection.close()


async def phase(fleet: Fleet, model: str, arm: Arm, args: argparse.Namespace, shared: bool, round_: int) -> None:
    until = time.perf_counter() + args.phase_s
    t0 = time.perf_counter()
    port = args.ports[model]
    await asyncio.gather(*(conversation_loop(port, model, arm, until, args.turns, args.max_tokens,
                                             seed=1000 * round_ + c + (0 if shared else 500), shared=shared)
                           for c in range(args.conversations)))
    arm.wall += time.perf_counter() - t0


def api_ready(port: int, model: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/models/{model}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the second API process (port {port}) did not become ready")


def counts(fleet: Fleet, model: str) -> tuple[int, int]:
    hits = steals = 0
    for worker in fleet.members(model):
        raw = fleet.redis.hmget(fleet.keys.worker(worker), ["affinity_hits", "affinity_steals"])
        hits += int(raw[0] or 0)
        steals += int(raw[1] or 0)
    return hits, steals


def uncovered(busy: list[tuple[float, float]], a: float, b: float) -> float:
    """How much of [a, b] no interval of `busy` (sorted by start) covers."""
    idle, at = 0.0, a
    for start, end in busy:
        if end <= at:
            continue
        if start >= b:
            break
        idle += max(start - at, 0.0)
        at = max(at, end)
    return idle + max(b - at, 0.0)


def idle_waits(fleet: Fleet, model: str, jobs: list[str], steal_ms: int, slack_ms: float) -> tuple[int, float]:
    """Jobs that waited past the steal threshold while some worker of the model ran none of them (idle for more than
    `slack_ms` of that time), and the longest such idle time (ms). A worker's busy times are its jobs' [taken, last
    written]; a worker that ran none of them was idle throughout."""
    pipe = fleet.redis.pipeline(transaction=False)
    for job in jobs:
        pipe.hmget(fleet.keys.job(job), [JobHash.TAKEN, JobHash.UPDATED, JobHash.QUEUE_MS, JobHash.WORKER])
    rows = [(float(taken) - float(queue) / 1000, float(taken), float(updated), worker.decode())
            for taken, updated, queue, worker in pipe.execute() if taken and updated and queue and worker]
    busy: dict[str, list[tuple[float, float]]] = {worker: [] for worker in fleet.members(model)}
    for _, taken, updated, worker in rows:
        busy.setdefault(worker, []).append((taken, updated))
    for spans in busy.values():
        spans.sort()
    count, longest = 0, 0.0
    for queued, taken, _, _ in rows:
        since = queued + steal_ms / 1000
        if taken <= since:
            continue
        idle = max(uncovered(spans, since, taken) for spans in busy.values()) * 1000
        if idle > slack_ms:
            count += 1
            longest = max(longest, idle)
    return count, longest


def summary(fleet: Fleet, model: str, arm: Arm, before: tuple[int, int], args: argparse.Namespace,
            steal_ms: int) -> dict[str, float]:
    ok = [r for r in arm.results if r.ok and r.first is not None]
    ttft = [(r.first - r.sent) * 1000 for r in ok]
    pipe = fleet.redis.pipeline(transaction=False)
    for job in arm.jobs:
        pipe.hmget(fleet.keys.job(job), [JobHash.QUEUE_MS, JobHash.TTFT_MS, JobHash.PROMPT_TOKENS, JobHash.WORKER])
    rows = [row for row in pipe.execute() if row[0] and row[1]]
    queue = [float(q) for q, *_ in rows]
    served = [float(t) - float(q) for q, t, *_ in rows]  # taken to first token: admission, prefill, first step
    per_worker = Counter(w for *_, w in rows if w)
    hits, steals = (now - then for now, then in zip(counts(fleet, model), before, strict=True))
    return {"requests": len(ok), "errors": len(arm.results) - len(ok), "ttft_p50": pct(ttft, 50),
            "ttft_p90": pct(ttft, 90), "req_s": len(ok) / arm.wall if arm.wall else 0.0,
            "tok_s": sum(r.tokens for r in ok) / arm.wall if arm.wall else 0.0,
            "hit_share": hits / len(ok) if ok else 0.0, "steals": steals,
            "queue_p50": pct(queue, 50), "queue_p90": pct(queue, 90), "queue_max_ms": max(queue, default=0.0),
            "served_p50": pct(served, 50), "served_p90": pct(served, 90),
            "prompt_tokens": sum(int(p) for _, _, p, _ in rows if p) / len(rows) if rows else 0.0,
            "busiest_share": max(per_worker.values(), default=0) / len(rows) if rows else 0.0,
            **dict(zip(("idle_waits", "idle_wait_max_ms"),
                       idle_waits(fleet, model, arm.jobs, steal_ms, args.idle_slack_ms), strict=True))}


def show(title: str, figures: dict[str, dict[str, float]]) -> None:
    """One column per arm, then each affinity arm's ratio to the plain one."""
    plain = figures["plain"]
    affine = [arm for arm in figures if arm != "plain"]
    label = {arm: "on" if arm == "affine" else f"on {arm.split('-')[1]}ms" for arm in affine}
    print(f"\n{title}")
    print(f"{'':16}" + "".join(f"{label[arm]:>14}" for arm in affine) + f"{'off':>14}"
          + "".join(f"{label[arm] + '/off':>14}" for arm in affine))
    for name, fmt in (("requests", "{:.0f}"), ("errors", "{:.0f}"), ("ttft_p50", "{:.0f} ms"),
                      ("ttft_p90", "{:.0f} ms"), ("req_s", "{:.2f}"), ("tok_s", "{:.1f}"), ("hit_share", "{:.0%}"),
                      ("steals", "{:.0f}"), ("queue_p50", "{:.0f} ms"),
                      ("queue_p90", "{:.0f} ms"), ("queue_max_ms", "{:.0f} ms"), ("served_p50", "{:.0f} ms"),
                      ("served_p90", "{:.0f} ms"), ("prompt_tokens", "{:.0f}"), ("busiest_share", "{:.0%}"),
                      ("idle_waits", "{:.0f}"), ("idle_wait_max_ms", "{:.0f} ms")):
        values = "".join(f"{fmt.format(figures[arm][name]):>14}" for arm in [*affine, "plain"])
        ratios = "".join(f"{figures[arm][name] / plain[name]:>14.2f}" if plain[name] else f"{'-':>14}"
                         for arm in affine)
        print(f"{name:16}{values}{ratios}")


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as work:
        entry = {"path": str(args.model), "cache_size": args.cache_gb, "enable_prefix_caching": True}
        # One affinity arm per steal threshold (the workers read it; the API does not).
        steal = ({"affine": args.steal_ms[0]} if len(args.steal_ms) == 1
                 else {f"affine-{ms}": ms for ms in args.steal_ms})
        arms = (*steal, "plain")
        fleet = Fleet({arm: entry for arm in arms}, Path(work), OVQ_AFFINITY="true")
        try:
            for _ in range(args.workers):
                for arm, ms in steal.items():
                    fleet.worker(arm, OVQ_AFFINITY="true", OVQ_AFFINITY_STEAL_MS=str(ms))
                fleet.worker("plain", OVQ_AFFINITY="false")
            plain_port = free_port()
            fleet.procs.append(fleet._start(["api"], OVQ_PORT=str(plain_port), OVQ_AFFINITY="false"))
            args.ports = {**dict.fromkeys(steal, fleet.port), "plain": plain_port}
            for arm in arms:
                fleet.ready(arm, args.workers, timeout=600)  # many workers start slowly on a busy machine
            api_ready(plain_port, "plain")
            for arm in arms:  # first steps of a fresh engine are slow (kernels for new shapes): not measured
                await phase(fleet, arm, Arm(), argparse.Namespace(**{**vars(args), "phase_s": args.warmup_s,
                                                                     "conversations": 2 * args.workers}), False, 99)
            loads = ((True, "shared prefixes (conversations over a long system prompt)"),
                     (False, "uniform load (no shared prefix)"))
            for shared, title in loads if args.uniform else loads[:1]:
                measured = {arm: Arm() for arm in arms}
                before = {arm: counts(fleet, arm) for arm in arms}
                rounds, phase_s = (args.rounds, args.phase_s) if shared else (args.uniform_rounds, args.uniform_phase_s)
                load = argparse.Namespace(**{**vars(args), "phase_s": phase_s})
                for round_ in range(rounds):
                    for arm in arms if round_ % 2 == 0 else arms[::-1]:
                        await phase(fleet, arm, measured[arm], load, shared, round_)
                await asyncio.sleep(args.heartbeat_wait_s)  # the workers' counts reach their hashes
                show(f"{title}: {args.workers} workers per arm, {args.conversations} clients, "
                     f"{rounds} x {phase_s:.0f} s per arm",
                     {arm: summary(fleet, arm, measured[arm], before[arm], args, steal.get(arm, args.steal_ms[0]))
                      for arm in arms})
        finally:
            fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=SMOLLM2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--phase-s", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--steal-ms", type=lambda v: [int(ms) for ms in v.split(",")], default=[500],
                        help="the steal threshold; several (100,250,500,1000): one affinity arm each")
    # 0 (grow as needed) keeps the cache only as big as the running sequences needed: a conversation's history is
    # evicted by the next few other prompts the engine runs, whichever worker it is routed to.
    parser.add_argument("--cache-gb", type=int, default=1, help="each engine's KV cache (GB; 0: grow as needed)")
    parser.add_argument("--no-uniform", dest="uniform", action="store_false", help="the shared-prefix load only")
    parser.add_argument("--uniform-rounds", type=int, default=4)
    parser.add_argument("--uniform-phase-s", type=float, default=60.0)
    parser.add_argument("--idle-slack-ms", type=float, default=250.0,
                        help="idle time during a job's wait past the threshold that does not count (wake-up)")
    parser.add_argument("--heartbeat-wait-s", type=float, default=3.0)
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
