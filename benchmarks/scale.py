#!/usr/bin/env python3
"""How ovq scales with workers and API processes: the serving path under load, not the model.

For each M x A: a private redis-server, M workers and A API processes (`ovq api --processes A`) on the tiny
random-weight Llama from tests/models (64 sequences per worker, 2 inference threads), and 64 x M closed-loop
streaming chats of N tokens from a lean asyncio client (benchmarks/sse_client.py). In the same run, one raw
in-process `ContinuousBatchingPipeline` step loop (64 streams, same threads) gives the yardstick: ratio = ovq tok/s
/ (M x raw tok/s). CPU time of every tier is measured over the run and shown per streamed token.

Each setting runs with the event journal off (plain streams) and on (every stream resumable: `X-Ovq-Resumable`,
so its worker also XADDs each step to the job's journal), one after the other on the same processes; Redis's CPU
per token is also read from its own INFO cpu (used_cpu_sys + used_cpu_user).

With enough cores (2 M + A + 2), each worker gets 2 cores, each API process one, and Redis with the client the
rest (taskset); on a smaller machine nothing is pinned.

  python benchmarks/scale.py                                  # M=1, A=1 (under 2 minutes on 2 cores)
  python benchmarks/scale.py --max-tokens 2 --journal off     # what a short request costs each tier
  python benchmarks/scale.py --workers 1,2,4,6 --apis 1,2,4   # on a bigger machine

`--baseline REV` runs that revision's API and workers too (a git worktree), each setting right before this tree's:
before and after in one run, as a speed-up is to be shown on a noisy machine (the raw yardstick runs once).
`--repeat N` runs each setting N times, the sides alternating, and adds each side's medians: on 2 shared cores one
20 s run of one side differs from the next by 5-15 %, more than most single changes save.
`--floor` adds, after each plain run, two yardsticks paced to that run's request rate, each beside the raw engine
loop: the bare HTTP server (benchmarks/bare_server.py: uvicorn streaming the same frames, nothing of ovq) and the
bare queue (benchmarks/bare_queue.py: XADD, XREADGROUP, one PUBLISH a step, XACK and XDEL on the same Redis, none of
ovq's queue features). What the API and Redis cost above them is ovq's own.
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
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bare_queue  # noqa: E402
import bare_server  # noqa: E402
import revisions  # noqa: E402
from serving import cpu_seconds, free_port, pct  # noqa: E402
from sse_client import Result, closed_loop  # noqa: E402

from common.redis.server import EmbeddedRedis  # noqa: E402

TINY = ROOT / "tests" / "models" / "tiny-llama"
MODEL = "tiny-llama"
SEQS = 64
TIERS = ("api", "worker I/O", "Redis (INFO cpu)")  # what a request's cost is shown for
THREADS = 2
PROMPTS = [f"Tell me about the number {i} and its friends" for i in range(64)]


# ---- the raw yardstick, in its own process (the same cores as worker 0) ----------------------------------------

RAW = """
import sys, time, openvino_genai as g
path, streams, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
duration, threads = float(sys.argv[4]), sys.argv[5]
sc = g.SchedulerConfig(); sc.cache_size = 0; sc.max_num_seqs = streams
pipe = g.ContinuousBatchingPipeline(path, sc, "CPU", {"INFERENCE_NUM_THREADS": int(threads)})
tok = pipe.get_tokenizer()
prompts = [tok.apply_chat_template([{"role": "user", "content": f"Tell me about the number {i} and its friends"}],
                                   add_generation_prompt=True) for i in range(64)]
cfg = g.GenerationConfig(); cfg.max_new_tokens = tokens; cfg.ignore_eos = True; cfg.do_sample = False
active, n = {}, 0
def add():
    global n
    n += 1
    active[n] = pipe.add_request(n, prompts[n % 64], cfg)
for _ in range(streams): add()
for _ in range(20): pipe.step()  # warm-up
done_tokens, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < duration:
    pipe.step()
    for rid in list(active):
        h = active[rid]
        if h.can_read():
            done_tokens += sum(len(o.generated_ids) for o in h.read().values())
        if h.get_status() != g.GenerationStatus.RUNNING and not h.can_read():
            del active[rid]
            add()
print(done_tokens / (time.perf_counter() - t0))
"""


def raw_tok_s(duration: float, tokens: int, cores: list[int] | None) -> float:
    command = [sys.executable, "-c", RAW, str(TINY), str(SEQS), str(tokens), str(duration), str(THREADS)]
    if cores:
        command = ["taskset", "-c", ",".join(map(str, cores)), *command]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])


# ---- ovq --------------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    workers: list[list[int] | None]
    apis: list[int] | None
    rest: list[int] | None


def plan(m: int, a: int) -> Plan:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 * m + a + 2:
        return Plan([None] * m, None, None)
    workers = [cores[2 * i:2 * i + 2] for i in range(m)]
    apis = cores[2 * m:2 * m + a]
    return Plan(workers, apis, cores[2 * m + a:])


class Stack:
    def __init__(self, m: int, a: int, work: Path, layout: Plan, root: Path = ROOT, unix: bool = False) -> None:
        self.root = root  # whose code the API and the workers run (`--baseline`: a worktree of another revision)
        self.redis = EmbeddedRedis(work / "redis", port=0 if unix else free_port())
        url = self.url = self.redis.start()
        if layout.rest:
            os.sched_setaffinity(self.redis.process.pid, layout.rest)
            os.sched_setaffinity(0, layout.rest)
        config = work / "models.json"
        options = {"path": str(TINY), "cache_size": 0, "max_num_seqs": SEQS,
                   "plugin_config": {"INFERENCE_NUM_THREADS": THREADS}}
        config.write_text(json.dumps({"models": {MODEL: options}}))
        self.port = free_port()
        env = {**os.environ, "REDIS_URL": url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(self.port),
               "OVQ_LOG_LEVEL": "warning", "OVQ_KEY_PREFIX": "ovqscale", "OVQ_API_PROCESSES": str(a),
               "PYTHONPATH": str(root)}
        self.workers = [self._start(["workers", "--model", MODEL], env, cores) for cores in layout.workers]
        self.api = self._start(["api"], env, layout.apis)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2)
                if health.status_code == 200 and health.json()["models"].get(MODEL):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError("ovq did not become ready")

    def _start(self, args: list[str], env: dict[str, str], cores: list[int] | None) -> subprocess.Popen[bytes]:
        prefix = ["taskset", "-c", ",".join(map(str, cores))] if cores else []
        return subprocess.Popen([*prefix, sys.executable, "-m", *args], env=env, cwd=self.root)

    def tiers(self) -> dict[str, list[psutil.Process]]:
        """Processes by tier: API (the supervisor and its processes), worker I/O halves, engines, Redis."""
        api = psutil.Process(self.api.pid)
        io = [psutil.Process(w.pid) for w in self.workers]
        engines = [c for w in io for c in w.children() if "resource_tracker" not in " ".join(c.cmdline())]
        return {"api": [api, *api.children(recursive=True)], "worker I/O": io, "engine": engines,
                "redis": [psutil.Process(self.redis.process.pid)], "client": [psutil.Process()]}

    def stop(self) -> None:
        for proc in [self.api, *self.workers]:
            proc.terminate()
        for proc in [self.api, *self.workers]:
            proc.wait(60)
        self.redis.stop()


def cpu(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    return {tier: cpu_seconds(procs) for tier, procs in processes.items()}


def bodies(tokens: int) -> list[dict]:
    return [{"model": MODEL, "messages": [{"role": "user", "content": p}], "max_tokens": tokens, "temperature": 0,
             "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}} for p in PROMPTS]


RESUMABLE = {"X-Ovq-Resumable": "true"}  # the journal on: every stream resumable (api/openai/resume.py)


def redis_counters(url: str) -> tuple[float, int]:
    """Redis's own count of its CPU seconds (INFO cpu: used_cpu_sys + used_cpu_user) and of the commands it ran
    (INFO commandstats, INFO itself left out)."""
    client = redis.Redis.from_url(url)
    info, stats = client.info("cpu"), client.info("commandstats")
    calls = sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), calls


def measure(m: int, a: int, duration: float, tokens: int, journal: list[bool], raw: float,
            code: tuple[str, Path] = ("this tree", ROOT), floor: bool = False, unix: bool = False) -> list[dict]:
    """One stack (of `code`'s tree); a run per journal setting, in turn, on the same warm processes. `floor`: then,
    with the stack stopped, the yardsticks of `floors` at each plain run's request rate. `unix`: Redis on a unix
    socket (as `ovq serve` runs it), not TCP."""
    layout = plan(m, a)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(m, a, Path(tmp), layout, code[1], unix)
        try:
            for on in journal:
                headers = RESUMABLE if on else None
                asyncio.run(closed_loop("127.0.0.1", stack.port, bodies(8), 8 * m, 2.0, headers=headers))  # warm-up
                processes = stack.tiers()
                before, redis_before = cpu(processes), redis_counters(stack.url)
                results, wall = asyncio.run(closed_loop("127.0.0.1", stack.port, bodies(tokens), SEQS * m, duration,
                                                        headers=headers))
                after, redis_after = cpu(processes), redis_counters(stack.url)
                runs.append((on, results, wall, {k: after[k] - before[k] for k in before},
                             (redis_after[0] - redis_before[0], redis_after[1] - redis_before[1])))
        finally:
            stack.stop()
    rows = []
    for on, results, wall, cpu_s, (redis_s, redis_calls) in runs:
        row = summarize(m, a, results, wall, cpu_s, raw)
        row["journal"], row["code"] = "on" if on else "off", code[0]
        row["redis_info_us_per_token"] = redis_s / max(row["tokens"], 1) * 1e6
        requests = max(row["requests"], 1)
        # Per request: what a short request (--max-tokens 2) costs each tier, and Redis's commands (exact).
        row["us_per_request"] = {**{tier: seconds / requests * 1e6 for tier, seconds in cpu_s.items()},
                                 "Redis (INFO cpu)": redis_s / requests * 1e6}
        row["redis_commands_per_request"] = redis_calls / requests
        if floor and not on:
            row.update(floors(m, a, tokens, duration, row["req_s"], results, unix))
        rows.append(row)
    return rows


def floors(m: int, a: int, tokens: int, duration: float, rate: float, results: list[Result],
           unix: bool = False) -> dict[str, float]:
    """The bare server's CPU and the bare queue's Redis CPU per request at `rate`, each beside the raw engine loop
    (as ovq's engine runs beside its API and Redis): on a busy machine a process wakes less often per request, so
    on an idle one the same floor reads higher (the bare server: 206-225 µs against 120-177 here)."""
    ok = [r for r in results if r.ok]
    events = max(round(sum(len(r.times) for r in ok) / max(len(ok), 1)), 1)
    engine = subprocess.Popen([sys.executable, "-c", RAW, str(TINY), str(SEQS), str(tokens), str(3 * duration + 30),
                               str(THREADS)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(5)  # the engine compiled and stepping
        server = bare_server.measure(bodies(tokens), SEQS * m, rate, events, duration, a)
        queue = bare_queue.measure(SEQS * m, rate, events, duration, unix)
    finally:
        engine.kill()
        engine.wait()
    return {"bare_us_per_request": server["us_per_request"], "bare_req_s": server["req_s"],
            "bare_redis_us_per_request": queue["redis_us_per_request"], "bare_redis_req_s": queue["req_s"]}


def summarize(m: int, a: int, results: list[Result], wall: float, cpu_s: dict[str, float], raw: float) -> dict:
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    ttft = [r.first - r.sent for r in ok if r.first is not None]
    return {"M": m, "A": a, "tokens": tokens, "requests": len(ok), "tok_s": tokens / wall, "req_s": len(ok) / wall,
            "failed": len(results) - len(ok),
            "ttft_p50_ms": pct(ttft, 50) * 1e3, "ttft_p95_ms": pct(ttft, 95) * 1e3, "raw_tok_s": raw,
            "ratio": tokens / wall / (m * raw), "tokens_per_event": tokens / max(sum(len(r.times) for r in ok), 1),
            "us_per_token": {tier: seconds / max(tokens, 1) * 1e6 for tier, seconds in cpu_s.items()},
            "api_cpu_pct_each": cpu_s["api"] / wall / a * 100}


def table(rows: list[dict]) -> str:
    tiers = list(rows[0]["us_per_token"])
    head = ["M × A", "code", "journal", "tok/s", "req/s", "TTFT p50 / p95 ms", "raw tok/s (one engine)", "ratio",
            "tokens/event", "API CPU % each", *[f"µs/token {t}" for t in tiers], "µs/token Redis (INFO cpu)",
            "µs/request API, worker I/O, Redis (INFO cpu)", "µs/request bare uvicorn, bare queue's Redis",
            "Redis commands/request", "failed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['M']} × {r['A']}", r.get("code", "this tree"), r["journal"], f"{r['tok_s']:,.0f}",
                 f"{r['req_s']:.1f}",
                 f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f}", f"{r['raw_tok_s']:,.0f}", f"{r['ratio']:.2f}",
                 f"{r['tokens_per_event']:.1f}",
                 f"{r['api_cpu_pct_each']:.0f}", *[f"{r['us_per_token'][t]:.1f}" for t in tiers],
                 f"{r['redis_info_us_per_token']:.2f}",
                 ", ".join(f"{r['us_per_request'][t]:.0f}" for t in TIERS),
                 f"{r['bare_us_per_request']:.0f}, {r['bare_redis_us_per_request']:.0f} (at {r['bare_req_s']:.0f}, "
                 f"{r['bare_redis_req_s']:.0f} req/s)" if "bare_us_per_request" in r else "-",
                 f"{r['redis_commands_per_request']:.1f}", str(r["failed"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def medians(rows: list[dict]) -> str:
    """Per setting and side, the median over its runs of what a request costs each tier, and of the job rate; and
    each tier's cost over the load client's. The client runs the same code on both sides, so its CPU a request
    measures how fast the machine ran that run: the ratio's runs spread 3-8 % where the costs spread 15-40."""
    head = ["M × A", "code", "journal", "runs", "req/s", "µs/request API", "worker I/O", "Redis (INFO cpu)",
            "bare uvicorn", "bare queue's Redis", "÷ client's: API", "worker I/O", "Redis"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["M"], r["A"], r["journal"], r.get("code", "this tree")), []).append(r)
    for (m, a, journal, code), runs in groups.items():
        per = [[r["us_per_request"][t] for r in runs] for t in TIERS]
        bare = [[r[k] for r in runs if k in r] for k in ("bare_us_per_request", "bare_redis_us_per_request")]
        relative = [[r["us_per_request"][t] / r["us_per_request"]["client"] for r in runs] for t in TIERS]
        cells = [f"{m} × {a}", code, journal, str(len(runs)), f"{statistics.median(r['req_s'] for r in runs):.0f}",
                 *[f"{statistics.median(values):.0f}" for values in per],
                 *[f"{statistics.median(values):.0f}" if values else "-" for values in bare],
                 *[f"{statistics.median(values):.2f}" for values in relative]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1")
    parser.add_argument("--apis", default="1")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of closed-loop load per setting")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--journal", default="off,on",
                        help="runs with the event journal off and/or on (resumable streams), in this order")
    parser.add_argument("--baseline", help="a revision (a commit, a tag) whose API and workers run too, each "
                        "setting right before this tree's (a git worktree of it): before and after, in one run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each setting, the sides alternating "
                        "(baseline, this tree, baseline, ...); with more than one, also the median of each side")
    parser.add_argument("--floor", action="store_true", help="after each plain run, the bare HTTP server "
                        "(benchmarks/bare_server.py) and the bare queue (benchmarks/bare_queue.py) at the same "
                        "request rate: the part of the API's and Redis's cost that is not ovq's")
    parser.add_argument("--unix", action="store_true", help="Redis on a unix socket, as `ovq serve` runs its embedded "
                        "one (TCP otherwise, as across hosts)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = parser.parse_args()
    rows = []
    journal = [setting == "on" for setting in args.journal.split(",")]
    with revisions.trees(args.baseline) as roots:
        for m in (int(x) for x in args.workers.split(",")):
            for a in (int(x) for x in args.apis.split(",")):
                raw = raw_tok_s(args.duration, args.max_tokens, plan(m, a).workers[0])  # one yardstick for both
                for _ in range(args.repeat):
                    for code in roots:
                        for row in measure(m, a, args.duration, args.max_tokens, journal, raw, code, args.floor,
                                           args.unix):
                            rows.append(row)
                            print(json.dumps(row), file=sys.stderr, flush=True)
    print(table(rows))
    if args.repeat > 1:
        print("\nMedians of the runs above, per side:\n")
        print(medians(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
