#!/usr/bin/env python3
"""ovq end to end (HTTP, Redis, worker) against raw in-process GenAI, side by side in one run.

Both sides: SmolLM2-135M-Instruct, the same chat-templated prompts, greedy, `ignore_eos`, N new tokens, a closed
loop at each concurrency C (C requests at once, each replaced by the next as it finishes, until
`waves * C` are done). Levels are interleaved (raw C, ovq C, next C) so machine noise hits both alike.

  raw: ContinuousBatchingPipeline with add_request + step() in this process (the physical limit);
       TTFT = add_request to the end of the step after which the first token was readable.
  ovq: the real stack (embedded redis-server, `python -m workers`, `python -m api`) driven over HTTP by the lean
       SSE client of `sse_client.py` in this process, one kept connection per stream (httpx parsing every chunk
       would take CPU from the engine on a small machine, which raw never pays); TTFT = request sent to the
       first content chunk received.

Prints one table: output tokens/s, TTFT p50/p95, inter-token latency p50, and ovq/raw ratios.

  python benchmarks/serving.py --concurrency 1,4,16,64 --max-tokens 128 --reps 2
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import httpx
import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from prompts import QUESTIONS  # noqa: E402
from sse_client import Connection  # noqa: E402

from common.keys import Keys  # noqa: E402
from common.models.prepare import prepare  # noqa: E402
from common.models.sources import default_model  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402
from common.settings import Settings  # noqa: E402

MODEL = "smollm2-135m-instruct"


@dataclass
class Level:
    system: str
    concurrency: int
    wall_s: float = 0.0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    # ovq: (request id, sent, first content chunk) in unix seconds, to split TTFT along the job's timestamps
    walls: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# ---- raw GenAI ----------------------------------------------------------------------------------------------


class Raw:
    def __init__(self, model_dir: Path) -> None:
        import openvino_genai as g

        self.g = g
        scheduler = g.SchedulerConfig()
        scheduler.cache_size = 0
        self.pipe = g.ContinuousBatchingPipeline(str(model_dir), scheduler, "CPU")
        tokenizer = g.Tokenizer(str(model_dir))
        self.prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
                        for q in QUESTIONS]
        self.next_id = 0

    def run(self, concurrency: int, requests: int, max_tokens: int, first_prompt: int = 0) -> Level:
        """`first_prompt`: the index of the first request's prompt (ovq's side uses the same sequence)."""
        g = self.g
        config = g.GenerationConfig()
        config.max_new_tokens, config.ignore_eos, config.do_sample = max_tokens, True, False
        level = Level("raw", concurrency)
        active: dict[int, dict] = {}
        started = 0

        def add() -> None:
            nonlocal started
            self.next_id += 1
            handle = self.pipe.add_request(self.next_id, self.prompts[(first_prompt + started) % len(self.prompts)],
                                          config)
            active[self.next_id] = {"h": handle, "t0": time.perf_counter(), "times": []}
            started += 1

        t0 = time.perf_counter()
        while started < min(concurrency, requests):
            add()
        while active:
            self.pipe.step()
            now = time.perf_counter()
            for rid in list(active):
                state = active[rid]
                handle = state["h"]
                if handle.can_read():
                    n = sum(len(o.generated_ids) for o in handle.read().values())
                    state["times"].extend([now] * n)
                if handle.get_status() != g.GenerationStatus.RUNNING and not handle.can_read():
                    times = state["times"]
                    level.tokens += len(times)
                    if times:
                        level.ttft.append(times[0] - state["t0"])
                        level.itl.extend(b - a for a, b in pairwise(times))
                    del active[rid]
                    if started < requests:
                        add()
        level.wall_s = time.perf_counter() - t0
        return level


# ---- ovq over HTTP ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User and system CPU seconds of `processes` so far (one that has ended counts nothing)."""
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


class Stack:
    """The real processes: a private redis-server, one worker per model, the API."""

    def __init__(self, models: dict[str, dict], work: Path) -> None:
        self.redis = EmbeddedRedis(work / "redis", port=free_port())
        self.url = url = self.redis.start()
        config = work / "models.json"
        config.write_text(json.dumps({"models": models}))
        port = free_port()
        env = {**os.environ, "REDIS_URL": url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(port),
               "OVQ_LOG_LEVEL": "warning", "OVQ_KEY_PREFIX": "ovqbench"}
        commands = [["workers", "--model", name] for name in models] + [["api"]]
        self.procs = [subprocess.Popen([sys.executable, "-m", *args], env=env, cwd=ROOT) for args in commands]
        self.port, self.base = port, f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                # /health is the API's own readiness (Redis answers); a model is ready once a worker serves it.
                if all(httpx.get(f"{self.base}/v2/models/{name}/ready", timeout=2).status_code == 200
                       for name in models):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError("ovq did not become ready")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(30)
        self.redis.stop()


async def _one(connection: Connection, index: int, max_tokens: int, level: Level) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    rid = uuid.uuid4().hex
    sent_unix = time.time()
    result = await connection.stream("/v3/chat/completions", body, {"X-Request-Id": rid})
    if not result.ok:
        raise RuntimeError(f"ovq request failed: {result.error}")
    level.tokens += result.tokens
    if result.first is not None:
        level.ttft.append(result.first - result.sent)
        level.itl.extend(b - a for a, b in pairwise(result.times))
        level.walls.append((rid, sent_unix, sent_unix + result.first - result.sent))


async def _ovq_level(port: int, concurrency: int, requests: int, max_tokens: int) -> Level:
    level = Level("ovq", concurrency)
    counter = iter(range(requests))

    async def loop() -> None:
        connection = Connection("127.0.0.1", port)
        try:
            for index in counter:
                await _one(connection, index, max_tokens, level)
        finally:
            connection.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    level.wall_s = time.perf_counter() - t0
    return level


def ovq_level(port: int, concurrency: int, requests: int, max_tokens: int) -> Level:
    return asyncio.run(_ovq_level(port, concurrency, requests, max_tokens))


# ---- report ------------------------------------------------------------------------------------------------


def merge(levels: list[Level]) -> Level:
    """Medians over repetitions for rates; latencies pooled."""
    out = Level(levels[0].system, levels[0].concurrency)
    out.wall_s = 1.0
    out.tokens = int(statistics.median(lv.tok_s for lv in levels))
    for lv in levels:
        out.ttft += lv.ttft
        out.itl += lv.itl
    return out


def report(results: dict[tuple[str, int], list[Level]], levels: list[int]) -> str:
    head = ("| conc | raw tok/s | ovq tok/s | ovq/raw | raw TTFT p50/p95 ms | ovq TTFT p50/p95 ms "
            "| TTFT p50 overhead ms | raw ITL p50 ms | ovq ITL p50 ms |")
    lines = [head, "|" + "---|" * 9]
    for c in levels:
        raw, ovq = merge(results[("raw", c)]), merge(results[("ovq", c)])
        lines.append(
            f"| {c} | {raw.tok_s:.0f} | {ovq.tok_s:.0f} | {ovq.tok_s / raw.tok_s:.2f} "
            f"| {pct(raw.ttft, 50) * 1e3:.0f} / {pct(raw.ttft, 95) * 1e3:.0f} "
            f"| {pct(ovq.ttft, 50) * 1e3:.0f} / {pct(ovq.ttft, 95) * 1e3:.0f} "
            f"| {(pct(ovq.ttft, 50) - pct(raw.ttft, 50)) * 1e3:+.1f} "
            f"| {pct(raw.itl, 50) * 1e3:.1f} | {pct(ovq.itl, 50) * 1e3:.1f} |"
        )
    return "\n".join(lines)


def ttft_pairs(raw: Raw, stack: Stack, pairs: int) -> str:
    """TTFT overhead alone: single requests, raw and ovq alternating, the median of per-pair differences; and
    where ovq's TTFT goes, from each job's own timestamps (its hash: created, taken, the worker's TTFT)."""
    diffs, raws, ovqs, walls = [], [], [], []
    loop = asyncio.new_event_loop()  # one connection, kept: a client's first request is not the point
    connection = Connection("127.0.0.1", stack.port)
    try:
        for i in range(pairs):
            # The same prompt on both sides: a prefill right after one of the same input shape is about 3 ms
            # faster than after one of another (measured on SmolLM2), so a fixed raw prompt flattered raw.
            r = raw.run(1, 1, 1, first_prompt=i)
            o = Level("ovq", 1)
            loop.run_until_complete(_one(connection, i, 1, o))
            if r.ttft and o.ttft:
                raws.append(r.ttft[0])
                ovqs.append(o.ttft[0])
                diffs.append(o.ttft[0] - r.ttft[0])
                walls += o.walls
    finally:
        connection.close()
        loop.close()
    return (f"TTFT at concurrency 1, {len(diffs)} alternating single requests: raw p50 {pct(raws, 50) * 1e3:.1f} ms, "
            f"ovq p50 {pct(ovqs, 50) * 1e3:.1f} ms, overhead p50 {pct(diffs, 50) * 1e3:+.1f} ms "
            f"(p25 {pct(diffs, 25) * 1e3:+.1f}, p75 {pct(diffs, 75) * 1e3:+.1f})\n" + hop(stack.url, walls))


def hop(url: str, walls: list[tuple[str, float, float]]) -> str:
    """ovq's TTFT in four parts (p50s, ms): the API (request sent to job queued), the queue (queued to a worker's
    read), the worker (read to its first token: screening, the engine's tokenizing and prefill), the way back
    (first token to the client). The hop is all but the worker's part."""
    parts: dict[str, list[float]] = {"API": [], "queue": [], "worker": [], "back": []}
    client = redis.Redis.from_url(url)
    keys = Keys("ovqbench")
    for rid, sent, first in walls:
        job = client.hgetall(keys.job(rid))
        if b"created" not in job or b"taken" not in job or b"ttft_ms" not in job:
            continue
        created, taken = float(job[b"created"]), float(job[b"taken"])
        token = created + float(job[b"ttft_ms"]) / 1000
        for name, ms in (("API", created - sent), ("queue", taken - created), ("worker", token - taken),
                         ("back", first - token)):
            parts[name].append(ms * 1000)
    client.close()
    if not parts["API"]:
        return "hop: no job timestamps found"
    p50 = {name: pct(values, 50) for name, values in parts.items()}
    return (f"ovq TTFT p50 parts: API {p50['API']:.1f} ms, queue {p50['queue']:.1f} ms, worker {p50['worker']:.1f} ms "
            f"(tokenize and prefill included), back {p50['back']:.1f} ms; hop (all but the worker) "
            f"{p50['API'] + p50['queue'] + p50['back']:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--waves", type=int, default=2, help="requests per level = waves * concurrency (>= 4)")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--ttft-pairs", type=int, default=30, help="single-request pairs for the TTFT overhead")
    parser.add_argument("--out", type=Path, help="also write the raw numbers as JSON")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model_dir = prepare(default_model(Settings()))
    raw = Raw(model_dir)
    raw.run(1, 1, 8)  # warm-up
    results: dict[tuple[str, int], list[Level]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack({MODEL: {"path": str(model_dir), "cache_size": 0}}, Path(tmp))
        try:
            ovq_level(stack.port, 1, 1, 8)  # warm-up
            for _ in range(args.reps):
                for c in levels:
                    n = max(args.waves * c, 4)
                    for system in ("raw", "ovq"):
                        level = raw.run(c, n, args.max_tokens) if system == "raw" else \
                            ovq_level(stack.port, c, n, args.max_tokens)
                        results.setdefault((system, c), []).append(level)
                        print(f"{system} c={c}: {level.tok_s:.0f} tok/s, TTFT p50 {pct(level.ttft, 50) * 1e3:.0f} ms",
                              file=sys.stderr)
            overhead = ttft_pairs(raw, stack, args.ttft_pairs) if args.ttft_pairs else ""
        finally:
            stack.stop()
    print(report(results, levels))
    print(overhead)
    if args.out:
        args.out.write_text(json.dumps({f"{s}@{c}": [vars(lv) for lv in lvs] for (s, c), lvs in results.items()}))


if __name__ == "__main__":
    main()
