#!/usr/bin/env python3
"""Interactive time to first token while a Batch API batch runs on the same worker, against the idle figure.

The real stack (embedded redis-server, one worker for SmolLM2-135M-Instruct, the API, `ovq batch-worker`).
Phases alternate: idle (no batch), then a large batch running (its lines fed `OVQ_BATCH_MAX_IN_FLIGHT` at a
time at batch priority) while the same interactive requests are sent one after another, then the batch is
cancelled and the next idle phase begins. TTFT is measured by a streaming client: request sent to the first
content chunk. Prints the p50 of each kind, their ratio, and the batch's lines per second.

  python benchmarks/batch_priority.py --rounds 3 --samples 8 --in-flight 8
"""
from __future__ import annotations

import argparse
import io
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
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from prompts import QUESTIONS  # noqa: E402
from serving import MODEL, free_port  # noqa: E402

from common.models.prepare import prepare  # noqa: E402
from common.models.sources import default_model  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402
from common.settings import Settings  # noqa: E402


def ttft(base: str, index: int, max_tokens: int) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    sent = time.perf_counter()
    with httpx.stream("POST", f"{base}/v3/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    return time.perf_counter() - sent
    raise RuntimeError("no content")


def batch_file(lines: int, max_tokens: int) -> bytes:
    return b"\n".join(orjson.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                 "messages": [{"role": "user", "content": QUESTIONS[(i + 7) % len(QUESTIONS)]}]}})
        for i in range(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8, help="interactive requests per phase")
    parser.add_argument("--in-flight", type=int, default=8, help="OVQ_BATCH_MAX_IN_FLIGHT")
    parser.add_argument("--max-tokens", type=int, default=16, help="interactive requests' max_tokens")
    parser.add_argument("--batch-max-tokens", type=int, default=64)
    args = parser.parse_args()
    model_dir = prepare(default_model(Settings()))
    work = Path(tempfile.mkdtemp(prefix="ovq-batch-bench-"))
    redis = EmbeddedRedis(work / "redis", port=free_port())
    url = redis.start()
    config = work / "models.json"
    config.write_text(json.dumps({"models": {MODEL: {"path": str(model_dir), "cache_size": 0}}}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "REDIS_URL": url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(port), "OVQ_LOG_LEVEL": "warning",
           "OVQ_KEY_PREFIX": "ovqbench", "OVQ_API_PROCESSES": "1", "OVQ_BATCH_API_URL": base,
           "OVQ_BATCH_MAX_IN_FLIGHT": str(args.in_flight), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", *a], env=env, cwd=ROOT)
             for a in (["workers", "--model", MODEL], ["api"], ["cli.main", "batch-worker"])]
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{base}/v2/models/{MODEL}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the stack did not start")
            time.sleep(0.5)
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        for i in range(3):
            ttft(base, i, args.max_tokens)  # warm-up
        idle: list[float] = []
        busy: list[float] = []
        lines_per_s: list[float] = []
        index = 0
        for _ in range(args.rounds):
            for _ in range(args.samples):
                idle.append(ttft(base, index, args.max_tokens))
                index += 1
            uploaded = client.files.create(file=("b.jsonl", io.BytesIO(batch_file(5000, args.batch_max_tokens))),
                                           purpose="batch")
            batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
            while client.batches.retrieve(batch.id).request_counts.completed < args.in_flight:
                time.sleep(0.2)  # lines are flowing: the worker runs `in_flight` of them at once
            for _ in range(args.samples):
                busy.append(ttft(base, index, args.max_tokens))
                index += 1
            client.batches.cancel(batch.id)
            ended = client.batches.retrieve(batch.id)
            lines_per_s.append(ended.request_counts.completed / (time.time() - ended.in_progress_at))
            while client.batches.retrieve(batch.id).status != "cancelled":
                time.sleep(0.2)
        p50_idle, p50_busy = statistics.median(idle), statistics.median(busy)
        print(f"interactive TTFT p50 idle        {p50_idle * 1000:8.1f} ms  ({len(idle)} samples)")
        print(f"interactive TTFT p50 under batch {p50_busy * 1000:8.1f} ms  ({len(busy)} samples, "
              f"{args.in_flight} batch lines in flight)")
        print(f"ratio                            {p50_busy / p50_idle:8.2f}")
        print(f"batch lines/s                    {statistics.mean(lines_per_s):8.2f}  (in progress to cancel, "
              f"{args.batch_max_tokens} tokens each)")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
