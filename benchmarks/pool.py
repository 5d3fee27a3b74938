#!/usr/bin/env python3
"""Pool workers against dedicated ones, and a wake against a cold start: Redis, one API process and the workers
started on this machine, every figure of one scenario from one run (the machine is shared and noisy: compare only
figures of the same run).

Scenarios:

  swap   three models (SmolLM2, the tiny Llama, the tiny draft Llama) under an open-loop load that shifts from one to
         the next (four phases: each model in turn takes 80% of the requests, then a mix), run three times on fresh
         fleets: a dedicated worker per model; one pool worker whose budget holds two of the three; two pool workers
         whose budgets hold one each. Per fleet: requests served of those sent, time to first token (the wait a swap
         adds shows there) p50 / p95, model swaps per minute, and the mean swap time (the unload's drain and
         engine stop, plus the next load).
  wake   one SmolLM2 worker: the first answer after a cold start (process start, imports, Redis, engine) against the
         first answer after a wake (the engine alone), and an answer from an awake worker as the baseline; and the
         worker's own count of its engine's restart (`woke_in_s`).

  python benchmarks/pool.py                 # both
  python benchmarks/pool.py wake --repeat 3
  python benchmarks/pool.py swap --phase-s 15 --rate 1.5
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fleet import BOUND_S, SMOLLM2, Fleet, chat  # noqa: E402
from prompts import QUESTIONS  # noqa: E402
from serving import pct  # noqa: E402
from sse_client import Connection, Result  # noqa: E402

from common.models.config import ModelConfig  # noqa: E402
from workers.pool.footprint import footprint  # noqa: E402

TINY = ROOT / "tests" / "models"
MODELS = {"smollm2": {"path": str(SMOLLM2), "cache_size": 0, "max_num_seqs": 8},
          "tiny-a": {"path": str(TINY / "tiny-llama"), "cache_size": 0, "max_num_seqs": 8},
          "tiny-b": {"path": str(TINY / "tiny-llama-draft"), "cache_size": 0, "max_num_seqs": 8}}
PHASES = [{"smollm2": 0.8, "tiny-a": 0.1, "tiny-b": 0.1}, {"smollm2": 0.1, "tiny-a": 0.8, "tiny-b": 0.1},
          {"smollm2": 0.1, "tiny-a": 0.1, "tiny-b": 0.8}, {"smollm2": 0.45, "tiny-a": 0.45, "tiny-b": 0.1}]
MIB = 1 << 20


async def ask(port: int, model: str, max_tokens: int, question: str = "What is the capital of France?") -> Result:
    connection = Connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(connection.stream("/v3/chat/completions", chat(model, question, max_tokens)),
                                      BOUND_S)
    finally:
        connection.close()


def api_up(fleet: Fleet, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{fleet.port}/v2/health/live", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError("the API did not come up")


# ---- swap ----------------------------------------------------------------------------------------------------------

@dataclass
class Run:
    name: str
    sent: int = 0
    served: int = 0
    ttft: list[float] = field(default_factory=list)
    seconds: float = 0.0
    swaps: int = 0
    swap_s: float = 0.0
    loads: int = 0

    def row(self, base: Run | None) -> str:
        p50, p95 = pct(self.ttft, 50) * 1000, pct(self.ttft, 95) * 1000
        added = f"{p50 - pct(base.ttft, 50) * 1000:+.0f} / {p95 - pct(base.ttft, 95) * 1000:+.0f}" if base else "–"
        per_min = f"{self.swaps / self.seconds * 60:.1f}" if self.seconds else "–"
        mean_swap = f"{self.swap_s / self.swaps:.2f}" if self.swaps else "–"
        return (f"| {self.name} | {self.served} / {self.sent} | {p50:.0f} / {p95:.0f} | {added} | {per_min} | "
                f"{mean_swap} |")


def pool_counters(fleet: Fleet) -> tuple[int, float, int]:
    """Over every pool now announced: unloads (swaps), seconds of unload + load per swap summed, loads."""
    swaps, seconds, loads = 0, 0.0, 0
    for pool_id in fleet.redis.zrange(fleet.keys.pools, 0, -1):
        raw = {k.decode(): v.decode() for k, v in fleet.redis.hgetall(fleet.keys.pool(pool_id.decode())).items()}
        if not raw:
            continue
        unloads, n = int(raw["unloads"]), int(raw["loads"])
        swaps += unloads
        loads += n
        # A swap is an unload and the load it made room for: the unload's time plus a mean load's.
        seconds += float(raw["unload_s"]) + (float(raw["load_s"]) / n * unloads if n else 0.0)
    return swaps, seconds, loads


async def shifting_load(fleet: Fleet, args: argparse.Namespace, run: Run) -> None:
    rng = random.Random(7)
    tasks: list[asyncio.Task[tuple[str, Result]]] = []

    async def one(model: str, question: str) -> tuple[str, Result]:
        return model, await ask(fleet.port, model, args.max_tokens, question)

    began = time.perf_counter()
    for phase in PHASES:
        end = time.perf_counter() + args.phase_s
        while time.perf_counter() < end:
            model = rng.choices(list(phase), weights=list(phase.values()))[0]
            tasks.append(asyncio.create_task(one(model, rng.choice(QUESTIONS))))
            await asyncio.sleep(rng.expovariate(args.rate))
    for model, result in await asyncio.gather(*tasks):
        run.sent += 1
        if result.ok and result.first is not None:
            run.served += 1
            run.ttft.append(result.first - result.sent)
        else:
            print(f"  {run.name}: a {model} request failed: {result.error}", file=sys.stderr)
    run.seconds = time.perf_counter() - began


async def swap_fleet(name: str, args: argparse.Namespace, pools: list[int] | None) -> Run:
    """`pools`: None for a dedicated worker per model, else each pool worker's budget in MiB."""
    run = Run(name)
    with tempfile.TemporaryDirectory() as work:
        fleet = Fleet(MODELS, Path(work))
        try:
            api_up(fleet)
            if pools is None:
                for model in MODELS:
                    fleet.worker(model)
                    fleet.ready(model)
            else:
                for budget in pools:
                    fleet.procs.append(fleet._start(["workers", "--pool"], OVQ_POOL_MEMORY_MB=str(budget)))
            for model in MODELS:  # warm (and for pools, a first load): outside the measure
                await ask(fleet.port, model, 4)
            swaps0, seconds0, loads0 = pool_counters(fleet)
            await shifting_load(fleet, args, run)
            swaps, seconds, loads = pool_counters(fleet)
            run.swaps, run.swap_s, run.loads = swaps - swaps0, seconds - seconds0, loads - loads0
        finally:
            fleet.stop()
    print(f"  {run.row(None)}", file=sys.stderr)
    return run


async def swap(args: argparse.Namespace) -> dict[str, object]:
    sizes = sorted((footprint(ModelConfig(name=n, **m)) for n, m in MODELS.items()), reverse=True)
    two, one = (sizes[0] + sizes[1]) // MIB + 16, sizes[0] // MIB + 16
    runs = [await swap_fleet("dedicated: a worker per model", args, None),
            await swap_fleet(f"one pool worker, {two} MiB (two models fit)", args, [two]),
            await swap_fleet(f"two pool workers, {one} MiB each (one model each)", args, [one, one])]
    print("\n| fleet | served / sent | TTFT p50 / p95 ms | added wait p50 / p95 ms | swaps / min | mean swap s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run in runs:
        print(run.row(None if run is runs[0] else runs[0]))
    return {"swap": [run.__dict__ | {"ttft": None, "ttft_p50_ms": pct(run.ttft, 50) * 1000,
                                     "ttft_p95_ms": pct(run.ttft, 95) * 1000} for run in runs],
            "footprints_mib": {n: footprint(ModelConfig(name=n, **m)) // MIB for n, m in MODELS.items()}}


# ---- wake ----------------------------------------------------------------------------------------------------------

def worker_state(fleet: Fleet, worker: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in fleet.redis.hgetall(fleet.keys.worker(worker)).items()}


def until(condition: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.05)


async def wake(args: argparse.Namespace) -> dict[str, object]:
    model = "smollm2"
    cold, woke, awake, engine = [], [], [], []
    with tempfile.TemporaryDirectory() as work:
        fleet = Fleet({model: MODELS[model]}, Path(work))
        try:
            api_up(fleet)
            proc = None
            for _ in range(args.repeat):  # a cold start: the request waits while the worker process starts
                if proc is not None:
                    proc.terminate()
                    proc.wait(60)
                    until(lambda: not fleet.members(model), "the last worker left")
                began = time.perf_counter()
                proc = fleet.worker(model)
                result = await ask(fleet.port, model, args.max_tokens)
                assert result.ok, result.error
                cold.append(time.perf_counter() - began)
            [worker] = fleet.members(model)
            for _ in range(args.repeat):
                result = await ask(fleet.port, model, args.max_tokens)  # awake: the baseline
                awake.append(time.perf_counter() - result.sent)
                fleet.redis.set(fleet.keys.steer(worker), "sleep", ex=600)
                until(lambda: worker_state(fleet, worker).get("state") == "asleep", "asleep")
                began = time.perf_counter()
                result = await ask(fleet.port, model, args.max_tokens)  # the job wakes it
                assert result.ok, result.error
                woke.append(time.perf_counter() - began)
                until(lambda: worker_state(fleet, worker).get("state") == "awake", "awake")
                engine.append(float(worker_state(fleet, worker)["woke_in_s"]))
        finally:
            fleet.stop()
    med = statistics.median
    print("\n| first answer (SmolLM2, "
          f"{args.max_tokens} tokens) | median s | each |")
    print("| --- | --- | --- |")
    for name, values in (("after a cold start (process, imports, Redis, engine)", cold),
                         ("after a wake (the engine alone)", woke), ("from an awake worker", awake),
                         ("the engine's restart in a wake (worker's own count)", engine)):
        print(f"| {name} | {med(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    return {"wake": {"cold_s": cold, "wake_s": woke, "awake_s": awake, "engine_restart_s": engine}}


SCENARIOS = {"swap": swap, "wake": wake}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--phase-s", type=float, default=15.0, help="each phase of the shifting load")
    parser.add_argument("--rate", type=float, default=1.5, help="requests per second (open loop)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="wake: cold starts and wakes each")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"no scenario {', '.join(sorted(unknown))}")
    figures: dict[str, object] = {}
    for name in args.scenarios or list(SCENARIOS):
        figures.update(asyncio.run(SCENARIOS[name](args)))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
