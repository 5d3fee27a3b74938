#!/usr/bin/env python3
"""Embeddings requests/s at 32 concurrent clients: the worker batching what waits into one pipeline call, against
one pipeline call per request, in the same run.

Two workers serve the same model directory under two names: `batched` with the default token budget
(OVQ_EMBED_BATCH_TOKENS) and `single` with a budget of 1 (each call takes one request). Rounds alternate between
them (A/B, so machine noise hits both); each round sends --requests requests from --concurrency clients, each a
short text. Prints each round (with its CPU milliseconds per request in each process: on a machine where the CPU is
the limit, these say what ratio batching can reach), the median of the per-pair ratios, and the medians.

  python benchmarks/embeddings.py --requests 1000 --rounds 3
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
from pathlib import Path

import httpx
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.redis.server import EmbeddedRedis  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog while a small cat sleeps in the sun".split()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_of(i: int) -> str:
    return f"{i} " + " ".join(WORDS[j % len(WORDS)] for j in range(i % 7, i % 7 + 8))


def direct(model_dir: Path, concurrency: int, rounds: int) -> tuple[float, float]:
    """The pipeline alone, in this process: texts/s of `concurrency` texts one call each, and in one call (the
    ceiling batching can reach, before any queue or HTTP cost)."""
    import openvino_genai as g

    pipe = g.TextEmbeddingPipeline(str(model_dir), "CPU")
    texts = [text_of(i) for i in range(concurrency)]
    pipe.embed_documents(texts)
    single, batched = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        for text in texts:
            pipe.embed_documents([text])
        single.append(len(texts) / (time.perf_counter() - started))
        started = time.perf_counter()
        pipe.embed_documents(texts)
        batched.append(len(texts) / (time.perf_counter() - started))
    return statistics.median(batched), statistics.median(single)


class Connection:
    """One kept-alive HTTP/1.1 connection posting JSON (httpx would cost the client more CPU than the server)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        data = orjson.dumps(body)
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        answer = orjson.loads(await self.reader.readexactly(length))
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {answer}")
        return answer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def round_of(port: int, model: str, requests: int, concurrency: int) -> float:
    """Requests/s of `requests` requests from `concurrency` closed-loop clients."""
    left = list(range(requests))
    connections = [Connection(port) for _ in range(concurrency)]

    async def client(connection: Connection) -> None:
        while left:
            answer = await connection.post("/v3/embeddings", {"model": model, "input": text_of(left.pop())})
            assert len(answer["data"]) == 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in connections))
    elapsed = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return requests / elapsed


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}


def timed_round(stack: Stack, model: str, requests: int, concurrency: int) -> tuple[float, dict[str, float]]:
    """Requests/s and each process's CPU milliseconds per request (the API, both workers, redis, this client)."""
    processes = stack.processes()
    before = cpu_seconds(processes)
    rate = asyncio.run(round_of(stack.port, model, requests, concurrency))
    after = cpu_seconds(processes)
    return rate, {name: (after[name] - before[name]) * 1000 / requests for name in processes}


class Stack:
    """A private redis-server, the API, and one worker per model with its own environment."""

    def __init__(self, model_dir: Path, work: Path, budget: int) -> None:
        self.redis = EmbeddedRedis(work / "redis", port=free_port())
        url = self.redis.start()
        config = work / "models.json"
        config.write_text(json.dumps({"models": {"batched": {"path": str(model_dir)},
                                                 "single": {"path": str(model_dir)}}}))
        self.port = free_port()
        env = {**os.environ, "REDIS_URL": url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(self.port),
               "OVQ_LOG_LEVEL": "warning", "OVQ_KEY_PREFIX": "ovqbench", "OVQ_API_PROCESSES": "1"}
        self.procs = [
            subprocess.Popen([sys.executable, "-m", "workers", "--model", "batched"], cwd=ROOT,
                             env={**env, "OVQ_EMBED_BATCH_TOKENS": str(budget)}),
            subprocess.Popen([sys.executable, "-m", "workers", "--model", "single"], cwd=ROOT,
                             env={**env, "OVQ_EMBED_BATCH_TOKENS": "1"}),
            subprocess.Popen([sys.executable, "-m", "api"], cwd=ROOT, env=env),
        ]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if all(httpx.get(f"http://127.0.0.1:{self.port}/v2/models/{m}/ready", timeout=2).status_code == 200
                       for m in ("batched", "single")):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError("ovq did not become ready")

    def processes(self) -> dict[str, psutil.Process]:
        assert self.redis.process is not None
        pids = {"worker(batched)": self.procs[0].pid, "worker(single)": self.procs[1].pid, "api": self.procs[2].pid,
                "redis": self.redis.process.pid, "client": os.getpid()}
        return {name: psutil.Process(pid) for name, pid in pids.items()}

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(30)
        self.redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "tests" / "models" / "tiny-embed")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=8192, help="the batched worker's OVQ_EMBED_BATCH_TOKENS")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"batched": [], "single": []}
    cpus: dict[str, list[float]] = {"batched": [], "single": []}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(args.model, Path(tmp), args.budget)
        try:
            for model in rates:  # warm-up
                asyncio.run(round_of(stack.port, model, args.concurrency * 2, args.concurrency))
            for n in range(args.rounds):
                for model in rates:
                    rate, cpu = timed_round(stack, model, args.requests, args.concurrency)
                    rates[model].append(rate)
                    cpus[model].append(sum(cpu.values()))
                    used = " ".join(f"{name}={ms:.2f}" for name, ms in cpu.items() if ms >= 0.01)
                    print(f"round {n + 1} {model}: {rate:.0f} requests/s; CPU ms/request: {used} "
                          f"(total {sum(cpu.values()):.2f})", flush=True)
        finally:
            stack.stop()
    pairs = [b / s for b, s in zip(rates["batched"], rates["single"], strict=True)]
    print(f"per-round batched/single: {' '.join(f'{r:.2f}' for r in pairs)}; median {statistics.median(pairs):.2f}")
    # CPU per request does not depend on how much of the machine the run got: the ratio a CPU-bound run reaches.
    by_cpu = [s / b for b, s in zip(cpus["batched"], cpus["single"], strict=True)]
    print(f"per-round CPU per request single/batched: {' '.join(f'{r:.2f}' for r in by_cpu)}; "
          f"median {statistics.median(by_cpu):.2f}")
    batched, single = statistics.median(rates["batched"]), statistics.median(rates["single"])
    alone_batched, alone_single = direct(args.model, args.concurrency, args.rounds * 3)
    print("| model | clients | requests/round | batched req/s | one call per request req/s | batched/single "
          "| pipeline alone: one call / one per text (texts/s) |\n" + "|---" * 7 + "|\n"
          f"| {args.model.name} | {args.concurrency} | {args.requests} | {batched:.0f} | {single:.0f} "
          f"| {batched / single:.2f} | {alone_batched:.0f} / {alone_single:.0f} = {alone_batched / alone_single:.2f} |")


if __name__ == "__main__":
    main()
