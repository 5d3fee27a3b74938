#!/usr/bin/env python3
"""The control plane's cost as the fleet grows (issue 40): N simulated workers behind A API processes on one Redis.

Workers are real text-worker I/O halves with a simulated engine (`benchmarks/fleetsim/`: it sleeps, per a profile
of the real engine, and emits token ids), `--per-host` of them per process. For each fleet size, on a fresh stack
(a private redis-server, `ovq api --processes A` on the tiny Llama of tests/models, the hollow hosts):

  idle:  `--idle` seconds with no load: Redis commands/s and Redis CPU per worker, hollow-host CPU per worker;
  load:  `--duration` seconds of `--streams` closed-loop streamed chats of `--tokens` tokens (the same offered load
         at every fleet size): Redis commands, Redis CPU (INFO cpu), API and worker CPU (psutil) per job, and the
         commands per job by name where they differ most between sizes.

Counts (commands, keys) are exact; CPU times are as noisy as the machine (a shared 2-core box: compare sizes within
one run). The figures of one run go to stdout as a table, and with --out as JSON.

  python benchmarks/fleet_scale.py --sizes 1,10,50 [--apis 1] [--per-host 25] [--profile smollm2]

Churn (`--churn N`): one worker serves; a load phase, then N hollow workers start and stop (`--at-once` at a time,
each until its first heartbeat), then the same load phase: Redis memory, key count, consumers in the streams'
groups and commands per job, before and after.

  python benchmarks/fleet_scale.py --churn 1000 [--at-once 10]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import free_port  # noqa: E402
from sse_client import closed_loop  # noqa: E402

from common.keys import Keys  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402

TINY = ROOT / "tests" / "models" / "tiny-llama"
MODEL = "tiny-llama"
PREFIX = "ovqfleetsim"
HOLLOW = ROOT / "benchmarks" / "fleetsim" / "hollow.py"
BOUND_S = 600.0  # the longest wait for a fleet to come up


class Stack:
    """A private redis-server, one `ovq api` (A processes) and the hollow hosts of N workers."""

    def __init__(self, work: Path, workers: int, apis: int, per_host: int, profile: str, seqs: int,
                 env: dict[str, str] | None = None) -> None:
        self.server = EmbeddedRedis(work / "redis", port=free_port(), appendonly=False)
        self.url = self.server.start()
        self.redis = redis.Redis.from_url(self.url)
        config = work / "models.json"
        config.write_text(json.dumps({"models": {MODEL: {"path": str(TINY), "cache_size": 0, "max_num_seqs": seqs}}}))
        self.port = free_port()
        self.env = {**os.environ, "REDIS_URL": self.url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(self.port),
                    "OVQ_LOG_LEVEL": "warning", "OVQ_KEY_PREFIX": PREFIX, "OVQ_API_PROCESSES": str(apis),
                    "OVQ_SIM_PROFILE": profile, "PYTHONPATH": str(ROOT), **(env or {})}
        self.keys = Keys(PREFIX)
        self.api = subprocess.Popen([sys.executable, "-m", "api"], env=self.env, cwd=ROOT)
        hosts = math.ceil(workers / per_host)
        self.hosts = [self.hollow(["--count", str(min(per_host, workers - i * per_host))]) for i in range(hosts)]
        self.wait(workers)

    def hollow(self, args: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(HOLLOW), "--model", MODEL, *args], env=self.env, cwd=ROOT)

    def members(self) -> int:
        return int(self.redis.zcard(self.keys.workers(MODEL, "CPU")))

    def wait(self, workers: int) -> None:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            try:
                ok = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok and self.members() >= workers:
                return
            for proc in (self.api, *self.hosts):
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
            time.sleep(0.5)
        raise RuntimeError(f"{workers} workers did not come up in {BOUND_S:.0f}s (have {self.members()})")

    def tiers(self) -> dict[str, list[psutil.Process]]:
        api = psutil.Process(self.api.pid)
        return {"api": [api, *api.children(recursive=True)], "workers": [psutil.Process(h.pid) for h in self.hosts]}

    def stop(self) -> None:
        for proc in (self.api, *self.hosts):
            proc.terminate()
        for proc in (self.api, *self.hosts):
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.server.stop()


class Snapshot:
    """Redis's command counts and CPU, and each tier's CPU seconds, at one moment."""

    def __init__(self, stack: Stack) -> None:
        stats = stack.redis.info("commandstats")
        self.calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        self.usec = {name.removeprefix("cmdstat_"): int(v["usec"]) for name, v in stats.items()}
        cpu = stack.redis.info("cpu")
        self.redis_cpu = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        self.cpu = {tier: sum(_cpu(p) for p in procs) for tier, procs in stack.tiers().items()}
        self.at = time.monotonic()

    def delta(self, before: Snapshot) -> dict[str, object]:
        calls = {k: v - before.calls.get(k, 0) for k, v in self.calls.items()}
        calls = {k: v for k, v in calls.items() if v and k != "info"}
        usec = {k: self.usec[k] - before.usec.get(k, 0) for k in calls}
        return {"seconds": self.at - before.at, "calls": calls, "commands": sum(calls.values()), "usec": usec,
                "redis_cpu": self.redis_cpu - before.redis_cpu,
                **{f"{tier}_cpu": self.cpu[tier] - before.cpu.get(tier, 0.0) for tier in self.cpu}}


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.NoSuchProcess:
        return 0.0


def bodies(tokens: int) -> list[dict]:
    return [{"model": MODEL, "messages": [{"role": "user", "content": f"Tell me about the number {i}"}],
             "max_tokens": tokens, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}} for i in range(64)]


def measure(size: int, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp), size, args.apis, args.per_host, args.profile, args.seqs)
        try:
            time.sleep(args.settle)  # past the first reclaim passes and the API's first cluster views
            before = Snapshot(stack)
            time.sleep(args.idle)
            idle = Snapshot(stack).delta(before)
            asyncio.run(closed_loop("127.0.0.1", stack.port, bodies(args.tokens), args.streams, 2.0))  # warm-up
            before = Snapshot(stack)
            results, wall = asyncio.run(closed_loop("127.0.0.1", stack.port, bodies(args.tokens), args.streams,
                                                    args.duration))
            load = Snapshot(stack).delta(before)
            keys = int(stack.redis.dbsize())
        finally:
            stack.stop()
    jobs = sum(1 for r in results if r.ok)
    return {"workers": size, "apis": args.apis, "jobs": jobs, "failed": len(results) - jobs,
            "tokens": sum(r.tokens for r in results if r.ok), "wall": wall, "idle": idle, "load": load, "keys": keys}


def state(stack: Stack) -> dict[str, int]:
    """Redis memory, keys, and the consumers of every stream's groups (a dead worker's consumer is state left)."""
    r = stack.redis
    consumers, kinds = 0, {}
    for key in r.scan_iter(match=f"{PREFIX}:*", count=1000):
        kind = key.decode().split(":")[1]
        kinds[kind] = kinds.get(kind, 0) + 1
    for key in r.scan_iter(match=f"{PREFIX}:*", count=1000, _type="stream"):
        consumers += sum(int(g["consumers"]) for g in r.xinfo_groups(key))
    return {"used_memory": int(r.info("memory")["used_memory"]), "keys": int(r.dbsize()), "consumers": consumers,
            "keys_by_kind": dict(sorted(kinds.items()))}


def load(stack: Stack, args: argparse.Namespace) -> dict[str, object]:
    before = Snapshot(stack)
    results, wall = asyncio.run(closed_loop("127.0.0.1", stack.port, bodies(args.tokens), args.streams,
                                            args.duration))
    delta = Snapshot(stack).delta(before)
    jobs = max(1, sum(1 for r in results if r.ok))
    return {"jobs": jobs, "commands_per_job": delta["commands"] / jobs,
            "redis_cpu_us_per_job": delta["redis_cpu"] / jobs * 1e6}


def churn(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp), 1, args.apis, 1, args.profile, args.seqs)
        try:
            time.sleep(args.settle)
            asyncio.run(closed_loop("127.0.0.1", stack.port, bodies(args.tokens), args.streams, 2.0))  # warm-up
            before = load(stack, args)
            before.update(state(stack))  # right before the churn: what the load left is in both
            print("before churn", json.dumps(before), flush=True)
            started = time.monotonic()
            subprocess.run([sys.executable, str(HOLLOW), "--model", MODEL, "--churn", str(args.churn),
                            "--at-once", str(args.at_once), "--hold", str(args.hold)],
                           env=stack.env, cwd=ROOT, check=True, timeout=3600)
            took = time.monotonic() - started
            after = state(stack)
            after.update(load(stack, args))
            print(f"after {args.churn} starts and stops ({took:.0f}s)", json.dumps(after), flush=True)
        finally:
            stack.stop()
    return {"churn": args.churn, "seconds": took, "before": before, "after": after}


def row(m: dict) -> str:
    idle, load, jobs, n = m["idle"], m["load"], max(1, m["jobs"]), m["workers"]
    per_s = idle["seconds"] * n
    return (f"{n:>7} {m['apis']:>4} {m['jobs'] / m['wall']:>7.1f} {load['commands'] / jobs:>9.1f} "
            f"{load['redis_cpu'] / jobs * 1e6:>9.0f} {load['api_cpu'] / jobs * 1e6:>9.0f} "
            f"{load['workers_cpu'] / jobs * 1e6:>9.0f} {idle['commands'] / per_s:>9.2f} "
            f"{idle['redis_cpu'] / per_s * 1e6:>9.0f} {idle['workers_cpu'] / per_s * 1e6:>9.0f} "
            f"{m['keys']:>6}")


HEADER = (f"{'workers':>7} {'apis':>4} {'jobs/s':>7} {'cmd/job':>9} {'redis µs':>9} {'api µs':>9} {'wrk µs':>9} "
          f"{'idle c/s':>9} {'idle r µs':>9} {'idle w µs':>9} {'keys':>6}\n"
          f"{'':>21} {'(per job, under load)':>39} {'(per worker per s, idle)':>29}")


def by_command(measured: list[dict]) -> str:
    """Commands per job by name, for the names whose count per job differs most between the sizes."""
    names = {k for m in measured for k in m["load"]["calls"]}
    per = {k: [m["load"]["calls"].get(k, 0) / max(1, m["jobs"]) for m in measured] for k in names}
    spread = sorted(per, key=lambda k: max(per[k]) - min(per[k]), reverse=True)[:12]
    lines = ["commands per job under load, by name (most change first): " + " ".join(str(m["workers"])
                                                                                    for m in measured)]
    lines += [f"  {k:<22}" + "".join(f"{v:>9.2f}" for v in per[k]) for k in spread]
    names = {k for m in measured for k in m["idle"]["calls"]}
    per = {k: [m["idle"]["calls"].get(k, 0) / (m["idle"]["seconds"] * m["workers"]) for m in measured]
           for k in names}
    lines.append("idle commands per worker per second, by name")
    lines += [f"  {k:<22}" + "".join(f"{v:>9.3f}" for v in per[k]) for k in sorted(per, key=lambda k: -max(per[k]))]
    names = {k for m in measured for k in m["idle"]["usec"]}
    per = {k: [m["idle"]["usec"].get(k, 0) / (m["idle"]["seconds"] * m["workers"]) for m in measured]
           for k in names}
    lines.append("idle Redis µs per worker per second, by command (INFO commandstats usec; a script's commands count "
                 "in evalsha too)")
    lines += [f"  {k:<22}" + "".join(f"{v:>9.1f}" for v in per[k]) for k in sorted(per, key=lambda k: -max(per[k]))]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,50", help="fleet sizes (workers), comma-separated")
    parser.add_argument("--apis", type=int, default=1, help="API processes")
    parser.add_argument("--per-host", type=int, default=25, help="hollow workers per process")
    parser.add_argument("--profile", default="smollm2", help="simulated engine profile (benchmarks/fleetsim)")
    parser.add_argument("--seqs", type=int, default=64, help="max_num_seqs of each worker")
    parser.add_argument("--streams", type=int, default=32, help="closed-loop streams, at every size")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=6.0)
    parser.add_argument("--churn", type=int, default=0, help="measure N worker starts and stops instead")
    parser.add_argument("--at-once", type=int, default=10, help="churn: workers started and stopped together")
    parser.add_argument("--hold", type=float, default=0.0, help="churn: seconds each worker runs after its first "
                        "heartbeat (0: stopped while that beat may be in flight)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.churn:
        result = churn(args)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        return 0
    measured = []
    for size in (int(s) for s in args.sizes.split(",")):
        measured.append(measure(size, args))
        print(json.dumps({k: v for k, v in measured[-1].items() if k not in ("idle", "load")}), flush=True)
    print(HEADER)
    for m in measured:
        print(row(m))
    print(by_command(measured))
    if args.out:
        args.out.write_text(json.dumps(measured, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
