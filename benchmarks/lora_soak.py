#!/usr/bin/env python3
"""Runtime LoRA adapters under load, through the tiers: a Redis, `--workers` workers of the tiny Llama, an API; a rank-4
adapter loaded for the whole run, a rank-8 one loaded and unloaded every `--churn-s`, and `--clients` clients sending
`--requests` mixed requests (the base model and both adapters; unary and streamed, some streams dropped mid-way,
n=2, stop strings, greedy and sampled).

Every request must end: 200 (a dropped stream counts as "dropped"), or a 404 for the coming-and-going adapter while
it is unloaded. It prints the outcomes, the loads and unloads, the engine rebuilds and crash restarts the workers
logged, and exits 1 if a request failed otherwise or an engine crashed.

  python benchmarks/lora_soak.py --requests 5000 --clients 8 --workers 2
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.lora_crash import LORA, MODELS, second_adapter  # noqa: E402

MODEL, ADMIN = "tiny", "adm-soak"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(work: Path, workers: int) -> tuple[list[subprocess.Popen], int]:
    redis_port, api_port = free_port(), free_port()
    procs = [subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)]
    (work / "models.json").write_text(json.dumps({"models": {MODEL: {"path": str(MODELS / "tiny-llama"),
                                                                     "cache_size": 0}}}))
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}", "OVQ_CONFIG": str(work / "models.json"),
           "OVQ_ADMIN_KEYS": ADMIN, "OVQ_API_PROCESSES": "1", "OVQ_LORA_POLL_S": "0.5", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(ROOT), "OVQ_LORA_DRAIN_S": os.environ.get("OVQ_LORA_DRAIN_S", "60")}
    roles = [(f"worker{i}", ["worker", "--model", MODEL]) for i in range(workers)]
    roles.append(("api", ["api", "--port", str(api_port)]))
    for name, args in roles:
        procs.append(subprocess.Popen([sys.executable, "-m", "cli.main", *args], env=env, cwd=ROOT,
                                      stdout=(work / f"{name}.log").open("wb"), stderr=subprocess.STDOUT))
    return procs, api_port


async def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 300
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{base}/v2/models/{MODEL}/ready")).status_code == 200:
                    await asyncio.sleep(5)  # the other workers start alongside
                    return
            await asyncio.sleep(0.5)
    raise RuntimeError("the tiers did not become ready")


async def one(client: httpx.AsyncClient, rng: random.Random, outcomes: Counter) -> None:
    model = rng.choice([MODEL, "stays", "flaky", f"{MODEL}:stays"])
    body = {"model": model, "prompt": "hello world the " * rng.randint(1, 6), "max_tokens": rng.randint(1, 48),
            "temperature": rng.choice([0, 0.9])}
    if rng.random() < 0.2:
        body["n"] = 2
    if rng.random() < 0.2:
        body["stop"] = ["the"]
    label = model.split(":")[-1]
    try:
        if rng.random() < 0.5:
            drop = rng.random() < 0.2
            async with client.stream("POST", "/v3/completions", json={**body, "stream": True}) as answer:
                lines = 0
                async for _ in answer.aiter_lines():
                    lines += 1
                    if drop and lines > 3:
                        break
                outcomes[(label, "dropped" if drop and answer.status_code == 200 else answer.status_code)] += 1
        else:
            outcomes[(label, (await client.post("/v3/completions", json=body)).status_code)] += 1
    except httpx.HTTPError as exc:
        outcomes[(label, type(exc).__name__)] += 1


async def soak(base: str, args: argparse.Namespace, flaky: Path) -> Counter:
    outcomes: Counter = Counter()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        loaded = await client.post("/v1/load_lora_adapter", headers=admin,
                                   json={"lora_name": "stays", "lora_path": str(LORA), "alpha": 0.7})
        loaded.raise_for_status()
        left = [args.requests]

        async def clients(seed: int) -> None:
            rng = random.Random(seed)
            while left[0] > 0:
                left[0] -= 1
                await one(client, rng, outcomes)

        async def churn() -> None:
            up = False
            while left[0] > 0:
                path, body = (("/v1/unload_lora_adapter", {"lora_name": "flaky"}) if up else
                              ("/v1/load_lora_adapter", {"lora_name": "flaky", "lora_path": str(flaky)}))
                outcomes[(path, (await client.post(path, headers=admin, json=body)).status_code)] += 1
                up = not up
                await asyncio.sleep(args.churn_s)

        await asyncio.gather(churn(), *(clients(args.seed + i) for i in range(args.clients)))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--churn-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ovq-lora-soak-"))
    procs, port = start(work, args.workers)
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(base))
        started = time.monotonic()
        outcomes = asyncio.run(soak(base, args, second_adapter(work)))
        seconds = time.monotonic() - started
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    logs = "".join(p.read_text(errors="replace") for p in work.glob("worker*.log"))
    crashes, rebuilds = logs.count("restarting it"), logs.count("rebuilding the engine")
    print(f"{args.requests} requests, {args.clients} clients, {args.workers} workers in {seconds:.0f} s")
    for key, count in sorted(outcomes.items(), key=str):
        print(f"  {key[0]:>24} {key[1]!s:>10}: {count}")
    print(f"engine rebuilds {rebuilds}, engine crash restarts {crashes}; logs in {work}")
    clean = {200, 404, "dropped"}
    bad = {k: v for k, v in outcomes.items() if k[1] not in clean or (k[1] == 404 and k[0] != "flaky")}
    return 1 if bad or crashes else 0


if __name__ == "__main__":
    sys.exit(main())
