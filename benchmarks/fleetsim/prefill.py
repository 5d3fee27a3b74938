#!/usr/bin/env python3
"""Prefill against decode step time of the real ContinuousBatchingPipeline (SmolLM2), for the simulated engine's
profile (benchmarks/fleetsim/simengine.py): median time of a step that prefills L prompt tokens, and of a decode
step of one sequence, measured in one run (on a shared machine only their ratio means anything).

  python benchmarks/fleetsim/prefill.py   # OVQ_FLEET_MODEL: the model directory (default: the ovq cache's SmolLM2)
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import openvino as ov
import openvino_genai as g

MODEL = os.environ.get("OVQ_FLEET_MODEL", os.path.expanduser("~/.cache/ovq/models/smollm2-135m-instruct"))


def timed(pipe: g.ContinuousBatchingPipeline) -> float:
    start = time.perf_counter()
    pipe.step()
    return time.perf_counter() - start


def measure(pipe: g.ContinuousBatchingPipeline, prompt_tokens: int, runs: int = 5) -> tuple[float, float]:
    config = g.GenerationConfig(max_new_tokens=8, ignore_eos=True)
    prefill, decode = [], []
    for run in range(runs):
        ids = [1] + [300 + (i % 500) for i in range(prompt_tokens - 1)]
        handle = pipe.add_request(run, ov.Tensor(np.array([ids], dtype=np.int64)), config)
        prefill.append(timed(pipe))
        while pipe.has_non_finished_requests():
            decode.append(timed(pipe))
        handle.read_all()
    return statistics.median(prefill), statistics.median(decode)


def main() -> None:
    scheduler = g.SchedulerConfig()
    scheduler.max_num_batched_tokens = 1024  # a 1000-token prompt in one step
    pipe = g.ContinuousBatchingPipeline(MODEL, scheduler, "CPU")
    for tokens in (16, 256, 1000):
        prefill, decode = measure(pipe, tokens)
        print(f"{tokens:>5} prompt tokens: prefill step {prefill * 1000:.1f} ms, decode step {decode * 1000:.1f} ms",
              flush=True)


if __name__ == "__main__":
    main()
