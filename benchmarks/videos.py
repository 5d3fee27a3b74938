#!/usr/bin/env python3
"""A video job's time, phase by phase, and what a video job does to text on the same host, in one run.

1. One video job through the queue (create, poll, download): its time in the queue, GenAI's own split of
   generate() (prompt encoding, denoising, VAE decoding), the MP4 encoding, and the pipeline's load time (measured
   in this process, as the worker loads it at start).
2. Text TTFT: streamed chats against a text worker, alone and while a video job runs on a video worker on the
   same host, alternated request by request; p50 and p99 and their ratio.

  python benchmarks/videos.py                       # tiny-ltx and tiny-llama from tests/models
  python benchmarks/videos.py --size 256x256 --steps 20 --chats 30
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import Stack  # noqa: E402

from common.keys import Keys  # noqa: E402

MODELS = ROOT / "tests" / "models"


def load_ms(model: Path) -> float:
    import openvino_genai as g

    started = time.perf_counter()
    g.Text2VideoPipeline(str(model), "CPU")
    return (time.perf_counter() - started) * 1000


def one_video(stack: Stack, client: httpx.Client, body: dict) -> dict[str, float]:
    started = time.perf_counter()
    video = client.post(f"{stack.base}/v3/videos", json=body).raise_for_status().json()
    while video["status"] not in ("completed", "failed"):
        time.sleep(0.05)
        video = client.get(f"{stack.base}/v3/videos/{video['id']}").raise_for_status().json()
    assert video["status"] == "completed", video
    client.get(f"{stack.base}/v3/videos/{video['id']}/content").raise_for_status()
    wall = (time.perf_counter() - started) * 1000
    fields = redis.Redis.from_url(stack.url).hgetall(Keys("ovqbench").job(video["id"].removeprefix("video_")))
    phases = {k.decode(): float(v) for k, v in fields.items()
              if k.decode() in ("queue_ms", "text_encode_ms", "denoise_ms", "vae_decode_ms", "mp4_encode_ms")}
    return {**phases, "client_wall_ms": wall}


def ttft_ms(stack: Stack, client: httpx.Client) -> float:
    body = {"model": "chat", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8,
            "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{stack.base}/v3/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter()
    assert first is not None, "the stream carried no content"
    return (first - started) * 1000


def videos_meanwhile(stack: Stack, body: dict, stop: threading.Event) -> None:
    """Video jobs one after another until stopped: a video is always running."""
    with httpx.Client(timeout=600) as client:
        while not stop.is_set():
            one_video(stack, client, body)


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=MODELS / "tiny-ltx")
    parser.add_argument("--text-model", type=Path, default=MODELS / "tiny-llama")
    parser.add_argument("--size", default="128x128")
    parser.add_argument("--seconds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--chats", type=int, default=20)
    args = parser.parse_args()
    body = {"model": "vid", "prompt": "waves on a beach", "size": args.size, "seconds": args.seconds,
            "num_inference_steps": args.steps, "frame_rate": 8, "seed": 1}
    loaded = load_ms(args.model)
    models = {"vid": {"path": str(args.model), "max_resolution": "1024x1024"},
              "chat": {"path": str(args.text_model), "cache_size": 0}}
    with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=600) as client:
        stack = Stack(models, Path(tmp))
        try:
            one_video(stack, client, body)  # warm-up
            phases = one_video(stack, client, body)
            ttft_ms(stack, client)  # warm-up
            calm = [ttft_ms(stack, client) for _ in range(args.chats)]
            stop = threading.Event()
            background = threading.Thread(target=videos_meanwhile, args=(stack, body, stop))
            background.start()
            busy = [ttft_ms(stack, client) for _ in range(args.chats)]
            stop.set()
            background.join()
        finally:
            stack.stop()
    print(f"| {args.model.name} {args.size} {args.seconds}s {args.steps} steps | ms |\n|---|---|\n"
          f"| pipeline load (in this process) | {loaded:.0f} |")
    for name, value in phases.items():
        print(f"| {name} | {value:.0f} |")
    print("\n| text TTFT (ms) | p50 | p99 |\n|---|---|---|")
    for name, values in (("alone", calm), ("beside a video job", busy)):
        print(f"| {name} | {statistics.median(values):.1f} | {pct(values, 0.99):.1f} |")
    print(f"\nTTFT p50 beside a video / alone: {statistics.median(busy) / statistics.median(calm):.2f}")


if __name__ == "__main__":
    main()
