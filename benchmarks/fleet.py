#!/usr/bin/env python3
"""The fleet as a scheduler: named scenarios run against Redis, the API and workers started on this machine, each
figure printed as a ratio against its baseline measured in the same run (the machine is shared and noisy: only
ratios from one run mean anything).

Scenarios (`SCENARIOS`, name -> async function; those of `benchmarks/fleet_sched.py`, flood_with_victim_tenant,
priorities_under_load and deadlines_under_overload, run through that script on a stack of its own):

  burst-join       120 streams at one SmolLM2 worker; a second worker starts 3 s later. Jobs the second owns
                   within 2 s of its first heartbeat, its share of those waiting then, and the burst's time; the
                   knee admission against greedy (`OVQ_ADMISSION=greedy`), each on a fresh fleet.
  greedy-vs-knee   one worker alone, closed-loop streams at 16 and 64: tokens/s and inter-token latency p50 of the
                   knee admission over greedy (two workers of the same model directory under two names, one per
                   admission, measured in turns).
  burst-ttft-raw   a burst of 16 streams of ~280-token prompts (chat and completions): TTFT p95 of ovq over raw
                   OpenVINO GenAI's for the same burst (shared/bench/genai_bench.py's step loop, in turns).

  python benchmarks/fleet.py                       # every scenario
  python benchmarks/fleet.py burst-join --short    # one scenario, a shorter version
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from prompts import QUESTIONS  # noqa: E402
from serving import free_port, pct  # noqa: E402
from sse_client import Connection, Result, closed_loop  # noqa: E402

from common.keys import Keys  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402

SMOLLM2 = Path(os.environ.get("OVQ_FLEET_MODEL", Path.home() / ".cache/ovq/models/smollm2-135m-instruct"))
GENAI_BENCH = Path(os.environ.get("OVQ_GENAI_BENCH", "/work/shared/bench/genai_bench.py"))
PREFIX = "ovqfleet"
BOUND_S = 900.0  # no wait on a tier is unbounded: a burst, a raw run, a worker's first heartbeat


@dataclass
class Figure:
    """One measured figure and its baseline from the same run."""

    name: str
    value: float
    baseline: float
    unit: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None


Scenario = Callable[[argparse.Namespace], Awaitable[list[Figure]]]


# ---- the fleet ----------------------------------------------------------------------------------------------------

class Fleet:
    """A private redis-server, one API process and the workers started on it, all on this machine."""

    def __init__(self, models: dict[str, dict], work: Path, **env: str) -> None:
        self.redis_server = EmbeddedRedis(work / "redis", port=free_port())
        self.url = self.redis_server.start()
        config = work / "models.json"
        config.write_text(json.dumps({"models": models}))
        self.port = free_port()
        self.env = {**os.environ, "REDIS_URL": self.url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(self.port),
                    "OVQ_LOG_LEVEL": "warning", "OVQ_KEY_PREFIX": PREFIX, "OVQ_API_PROCESSES": "1", **env}
        self.keys = Keys(PREFIX)
        self.redis = redis.Redis.from_url(self.url)
        self.procs: list[subprocess.Popen[bytes]] = [self._start(["api"])]

    def _start(self, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", *args], env={**self.env, **env}, cwd=ROOT)

    def worker(self, model: str, **env: str) -> subprocess.Popen[bytes]:
        proc = self._start(["workers", "--model", model], **env)
        self.procs.append(proc)
        return proc

    def members(self, model: str) -> list[str]:
        return [m.decode() for m in self.redis.zrange(self.keys.workers(model, "CPU"), 0, -1)]

    def ready(self, model: str, workers: int = 1, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if (len(self.members(model)) >= workers and httpx.get(
                        f"http://127.0.0.1:{self.port}/v2/models/{model}/ready", timeout=2).status_code == 200):
                    return
            except (httpx.HTTPError, redis.RedisError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{model}: {workers} worker(s) did not become ready")

    def waiting(self, model: str) -> int:
        stream = self.keys.jobs(model, "CPU")
        return self.redis.xlen(stream) - self.redis.xpending(stream, "workers")["pending"]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.redis.close()
        self.redis_server.stop()


class IdConnection(Connection):
    """Also keeps the completion's id (its job id after the prefix): who ran it is in the job's record."""

    @staticmethod
    def _event(event: bytes, now: float, result: Result) -> None:
        if not getattr(result, "id", "") and event.startswith(b"data: {"):
            result.id = orjson.loads(event[6:]).get("id", "")  # type: ignore[attr-defined]
        Connection._event(event, now, result)


async def burst(port: int, bodies: list[dict], path: str = "/v3/chat/completions") -> tuple[list[Result], float]:
    """Every body at once, one connection each; the results and the time until the last ended."""
    t0 = time.perf_counter()

    async def one(body: dict) -> Result:
        connection = IdConnection("127.0.0.1", port)
        try:
            return await connection.stream(path, body)
        finally:
            connection.close()

    results = await asyncio.wait_for(asyncio.gather(*(one(b) for b in bodies)), BOUND_S)
    return list(results), time.perf_counter() - t0


def chat(model: str, content: str, max_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def completion(model: str, prompt: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


def smollm2(**options: object) -> dict:
    return {"path": str(SMOLLM2), "cache_size": 1, **options}


async def warm(port: int, model: str) -> None:
    await burst(port, [chat(model, q, 16) for q in QUESTIONS[:4]])


def itl_p50(results: list[Result]) -> float:
    gaps = [b - a for r in results for a, b in itertools.pairwise(r.times)]
    return pct(gaps, 50) if gaps else 0.0


# ---- burst with a joining worker -----------------------------------------------------------------------------------

@dataclass
class Join:
    within_2s: int = 0
    waiting: int = 0
    taken: int = 0
    burst_s: float = 0.0
    first: list[int] = field(default_factory=list)


async def _join_run(args: argparse.Namespace, admission: str) -> Join:
    model = "smollm2"
    with tempfile.TemporaryDirectory() as work:
        fleet = Fleet({model: smollm2()}, Path(work), OVQ_ADMISSION=admission)
        try:
            fleet.worker(model)
            fleet.ready(model)
            await warm(fleet.port, model)
            first = set(fleet.members(model))
            bodies = [chat(model, QUESTIONS[i % len(QUESTIONS)], args.join_tokens) for i in range(args.streams)]
            task = asyncio.create_task(burst(fleet.port, bodies))
            await asyncio.sleep(3.0)
            fleet.worker(model)
            joined_at, waiting = None, 0
            deadline = time.monotonic() + 180
            while joined_at is None and not task.done() and time.monotonic() < deadline:
                if set(fleet.members(model)) - first:
                    joined_at, waiting = time.time(), fleet.waiting(model)
                await asyncio.sleep(0.02)
            results, wall = await task
            second = (set(fleet.members(model)) - first).pop() if joined_at else None
            print(f"#   {admission}: {waiting} waiting at the 2nd worker's first heartbeat; burst {wall:.1f} s",
                  flush=True)
            run = Join(waiting=waiting, burst_s=wall)
            for result in results:
                job = getattr(result, "id", "").split("-", 1)[-1]
                record = fleet.redis.hmget(fleet.keys.job(job), "worker", "taken")
                if second is None or record[0] is None or record[0].decode() != second:
                    continue
                run.taken += 1
                run.within_2s += float(record[1] or 0) - (joined_at or 0) <= 2.0
            return run
        finally:
            fleet.stop()


async def burst_join(args: argparse.Namespace) -> list[Figure]:
    knee = await _join_run(args, "knee")
    greedy = await _join_run(args, "greedy")
    share = knee.taken / knee.waiting if knee.waiting else 0.0
    share_greedy = greedy.taken / greedy.waiting if greedy.waiting else 0.0
    return [
        Figure("jobs waiting at the 2nd worker's first heartbeat", knee.waiting, greedy.waiting, "jobs"),
        Figure("jobs the 2nd worker owns within 2 s of its first heartbeat", knee.within_2s, greedy.within_2s, "jobs"),
        Figure("share of those waiting the 2nd worker took", share, share_greedy, "",
               "must be >= 1/3"),
        Figure(f"burst of {args.streams} streams, wall time", knee.burst_s, greedy.burst_s, "s", "knee / greedy"),
    ]


# ---- greedy against knee, one worker alone ----------------------------------------------------------------------

async def greedy_vs_knee(args: argparse.Namespace) -> list[Figure]:
    models = {"smol-knee": smollm2(), "smol-greedy": smollm2()}
    figures = []
    with tempfile.TemporaryDirectory() as work:
        fleet = Fleet(models, Path(work))
        try:
            fleet.worker("smol-knee", OVQ_ADMISSION="knee")
            fleet.worker("smol-greedy", OVQ_ADMISSION="greedy")
            fleet.ready("smol-knee")
            fleet.ready("smol-greedy")
            bodies = {m: [chat(m, q, args.loop_tokens) for q in QUESTIONS] for m in models}
            for m in models:  # compiled kernels, and a curve for the knee to start from
                await closed_loop("127.0.0.1", fleet.port, bodies[m], 64, args.loop_s / 2)
            for streams in (16, 64):
                got: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
                # A B B A (A B when short): drift falls on both alike
                turns = list(models) if args.short else [*models, *reversed(models)]
                for m in turns * args.reps:
                    results, wall = await closed_loop("127.0.0.1", fleet.port, bodies[m], streams, args.loop_s)
                    tokens = sum(r.tokens for r in results if r.ok)
                    got[m].append((tokens / wall, itl_p50(results)))
                    print(f"#   {m} at {streams}: {tokens / wall:.1f} tok/s, ITL p50 {itl_p50(results) * 1000:.1f} ms",
                          flush=True)
                knee, greedy = got["smol-knee"], got["smol-greedy"]
                figures.append(Figure(f"{streams} streams: tokens/s", statistics.median(t for t, _ in knee),
                                      statistics.median(t for t, _ in greedy), "tok/s", "knee / greedy, >= 0.95"))
                figures.append(Figure(f"{streams} streams: ITL p50", statistics.median(i for _, i in knee) * 1000,
                                      statistics.median(i for _, i in greedy) * 1000, "ms",
                                      "knee / greedy, <= 1"))
            figures.append(admission_figure(fleet.redis, fleet.keys.worker(fleet.members("smol-knee")[0])))
        finally:
            fleet.stop()
    return figures


def admission_figure(client: redis.Redis, worker_key: str) -> Figure:
    """A worker's admission limit against its max_num_seqs, both from its heartbeat's hash (`capacity` is its
    max_num_seqs)."""
    limit, capacity = client.hmget(worker_key, ["admission_limit", "capacity"])
    return Figure("the knee worker's admission limit", float(limit or 0), float(capacity or 0), "seqs",
                  "over its max_num_seqs")


# ---- a burst's TTFT against raw GenAI -----------------------------------------------------------------------------

RAW = """
import json, sys, types
sys.path.insert(0, sys.argv[1])
import genai_bench as b
import openvino_genai as g
model, prompts, reps, tokens = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
sc = b.make_scheduler(types.SimpleNamespace(cache_size=1, max_num_seqs=256), 256, True)
pipe = g.ContinuousBatchingPipeline(model, sc, "CPU")
b.run_step_level(pipe, prompts["chat"][:4], 4, 4, 16, rid_base=10_000_000)
rid = 0
for line in sys.stdin:
    kind = line.strip()
    rec = b.run_step_level(pipe, prompts[kind], len(prompts[kind]), len(prompts[kind]), tokens, rid_base=rid)
    rid += 1000
    print(json.dumps({"kind": kind, "ttft_p95_s": rec["ttft_p95_s"], "ttft_p50_s": rec["ttft_p50_s"]}), flush=True)
"""


def long_prompts(n: int, tokens: int) -> list[str]:
    """n different prompts of about `tokens` tokens (SmolLM2's tokenizer), each a run of questions to answer."""
    import openvino_genai as g

    tokenizer = g.Tokenizer(str(SMOLLM2))
    out = []
    for i in range(n):
        text = "Answer each of these questions in one line."
        for q in itertools.islice(itertools.cycle(QUESTIONS), i, None):
            longer = f"{text} {q}"
            if tokenizer.encode(longer, add_special_tokens=False).input_ids.data.shape[1] > tokens:
                break
            text = longer
        out.append(text)
    return out


async def burst_ttft_raw(args: argparse.Namespace) -> list[Figure]:
    if not GENAI_BENCH.exists():
        print(f"# burst-ttft-raw: {GENAI_BENCH} not found (OVQ_GENAI_BENCH), skipped")
        return []
    import openvino_genai as g

    model = "smollm2"
    texts = long_prompts(16, 262)  # ~270 plain, ~286 once chat-templated (as in the measurement)
    tokenizer = g.Tokenizer(str(SMOLLM2))
    templated = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                 for t in texts]
    raw = subprocess.Popen([sys.executable, "-c", RAW, str(GENAI_BENCH.parent), str(SMOLLM2),
                            json.dumps({"chat": templated, "completions": texts}), "1", str(args.ttft_tokens)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    got: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as work:
        fleet = Fleet({model: smollm2()}, Path(work))
        try:
            fleet.worker(model)
            fleet.ready(model)
            await warm(fleet.port, model)
            for _ in range(args.reps):
                for kind in ("chat", "completions"):
                    assert raw.stdin is not None and raw.stdout is not None
                    raw.stdin.write(kind + "\n")
                    raw.stdin.flush()
                    line = await asyncio.wait_for(asyncio.to_thread(raw.stdout.readline), BOUND_S)
                    got.setdefault(("raw", kind), []).append(json.loads(line)["ttft_p95_s"])
                    if kind == "chat":
                        bodies = [chat(model, t, args.ttft_tokens) for t in texts]
                        results, _ = await burst(fleet.port, bodies)
                    else:
                        bodies = [completion(model, t, args.ttft_tokens) for t in texts]
                        results, _ = await burst(fleet.port, bodies, "/v3/completions")
                    ttft = [r.first - r.sent for r in results if r.ok and r.first is not None]
                    got.setdefault(("ovq", kind), []).append(pct(ttft, 95))
                    print(f"#   {kind}: TTFT p95 ovq {pct(ttft, 95):.2f} s, raw {got[('raw', kind)][-1]:.2f} s",
                          flush=True)
        finally:
            fleet.stop()
            if raw.stdin is not None:
                raw.stdin.close()
            raw.wait(60)
    return [Figure(f"16-stream burst, {kind}: TTFT p95", statistics.median(got[("ovq", kind)]),
                   statistics.median(got[("raw", kind)]), "s", "ovq / raw GenAI, <= 1.3")
            for kind in ("chat", "completions")]


SCENARIOS: dict[str, Scenario] = {
    "burst-join": burst_join,
    "greedy-vs-knee": greedy_vs_knee,
    "burst-ttft-raw": burst_ttft_raw,
}
# Scheduling scenarios (tenants, priorities, deadlines) live in fleet_sched.py with a stack of their own (keys with
# tenants, a fair and a FIFO API on one worker): run by name through that script, after this one's.
SCHED = Path(__file__).with_name("fleet_sched.py")
SCHED_SCENARIOS = tuple(importlib.import_module("fleet_sched").SCENARIOS)


def table(name: str, figures: list[Figure]) -> str:
    lines = [f"## {name}", "| figure | value | baseline | ratio | note |", "| --- | --- | --- | --- | --- |"]
    for f in figures:
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "n/a"
        lines.append(f"| {f.name} | {f.value:.3g} {f.unit} | {f.baseline:.3g} {f.unit} | {ratio} | {f.note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", help=f"of: {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--short", action="store_true", help="shorter runs, for a busy machine")
    parser.add_argument("--streams", type=int, default=120, help="burst-join: streams in the burst")
    parser.add_argument("--reps", type=int, default=None, help="turns of each measurement (default 3, short 1)")
    args = parser.parse_args()
    args.reps = args.reps or (1 if args.short else 3)
    args.join_tokens = 64 if args.short else 256
    args.loop_tokens = 32 if args.short else 128
    args.loop_s = 5.0 if args.short else 20.0
    args.ttft_tokens = 8 if args.short else 32
    names = args.scenarios or [*SCENARIOS, *SCHED_SCENARIOS]
    unknown = [n for n in names if n not in SCENARIOS and n not in SCHED_SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join([*SCENARIOS, *SCHED_SCENARIOS])}")
    # A timeout's SIGTERM ends the run through its `finally`s: the fleet's processes and Redis stop with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    for name in [n for n in names if n in SCENARIOS]:
        t0 = time.monotonic()
        figures = asyncio.run(SCENARIOS[name](args))
        print(table(name, figures), flush=True)
        print(f"# {name}: {time.monotonic() - t0:.0f} s; load average {os.getloadavg()}\n", flush=True)
    if sched := [n for n in names if n in SCHED_SCENARIOS]:
        subprocess.run([sys.executable, str(SCHED), *sched], check=True)


if __name__ == "__main__":
    main()
