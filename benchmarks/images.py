#!/usr/bin/env python3
"""ovq's image endpoint against calling Text2ImagePipeline directly, side by side in one run.

Same model (the tiny random-weight SD in tests/models by default, or --model DIR), prompt, size, steps and seed.
Alternates direct / ovq request by request and prints medians and the overhead (ovq - direct), absolute and as
a ratio. The direct side times `generate()` plus PNG encoding (what a server must do at least).

  python benchmarks/images.py --steps 4 --size 64x64 --requests 10
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import Stack  # noqa: E402

PROMPT = "a lighthouse on a cliff at sunset"


def direct(model_dir: Path, size: tuple[int, int], steps: int):
    import numpy as np
    import openvino_genai as g

    pipe = g.Text2ImagePipeline(str(model_dir), "CPU")

    def run() -> float:
        start = time.perf_counter()
        pixels = np.asarray(pipe.generate(PROMPT, width=size[0], height=size[1], num_inference_steps=steps,
                                          rng_seed=42).data)
        Image.fromarray(pixels[0]).save(io.BytesIO(), format="PNG")
        return time.perf_counter() - start

    return run


def ovq(stack: Stack, client: httpx.Client, size: str, steps: int) -> float:
    body = {"model": "img", "prompt": PROMPT, "size": size, "num_inference_steps": steps, "rng_seed": 42}
    start = time.perf_counter()
    client.post(f"{stack.base}/v3/images/generations", json=body).raise_for_status()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "tests" / "models" / "tiny-sd")
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    raw = direct(args.model, (width, height), args.steps)
    raw()  # warm-up
    times: dict[str, list[float]] = {"direct": [], "ovq": []}
    with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=600) as client:
        stack = Stack({"img": {"path": str(args.model)}}, Path(tmp))
        try:
            ovq(stack, client, args.size, args.steps)  # warm-up
            for _ in range(args.requests):
                times["direct"].append(raw())
                times["ovq"].append(ovq(stack, client, args.size, args.steps))
        finally:
            stack.stop()
    d, o = statistics.median(times["direct"]), statistics.median(times["ovq"])
    print("| model | size | steps | direct p50 ms | ovq p50 ms | overhead ms | ovq/direct |\n" + "|---" * 7 + "|\n"
          f"| {args.model.name} | {args.size} | {args.steps} | {d * 1e3:.1f} | {o * 1e3:.1f} | {(o - d) * 1e3:+.1f} "
          f"| {o / d:.2f} |")


if __name__ == "__main__":
    main()
