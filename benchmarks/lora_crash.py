#!/usr/bin/env python3
"""GenAI-only reproducer: switching LoRA adapters of different ranks between continuous-batching runs crashes the
CPU plugin (openvino-genai 2026.4.1; a segfault or `malloc(): ... corrupted` in `InferRequest::infer` under
`ContinuousBatchingPipeline::step()`).

What it does, as ovq's engine did before `workers/engine/lora.py`: one pipeline in `MODE_DYNAMIC` with two adapters
(the tiny Llama's rank-4 adapter, and a rank-8 one on fewer layers written next to it), then over and over: switch
the adapter with a one-token `generate()` (base = an empty `AdapterConfig()`), run a group of requests through
`add_request` + `step()` (random prompt lengths and budgets, sampling, a few cancelled), drain. Exit status 0 means
no crash in `--jobs` jobs; a crash kills the process (139 for a segfault, 134 for malloc's abort).

  python benchmarks/lora_crash.py --jobs 3000 --seed 1             # crashed in most runs here
  python benchmarks/lora_crash.py --jobs 3000 --seed 1 --alike     # ovq's workaround: no crash
"""
from __future__ import annotations

import argparse
import faulthandler
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = ROOT / "tests/models"
LORA = MODELS / "tiny-llama-lora/adapter_model.safetensors"


def second_adapter(directory: Path) -> Path:
    """A rank-8 adapter on q_proj and v_proj only, random weights (from the rank-4 one's layer shapes)."""
    import numpy as np

    from workers.engine import lora

    rng = np.random.default_rng(7)
    matrices = {}
    for name, matrix in lora.read(LORA).items():
        if "q_proj" in name or "v_proj" in name:
            shape = [8, matrix.shape[1]] if "lora_A" in name else [matrix.shape[0], 8]
            values = (rng.standard_normal(shape) * 0.5).astype(np.float32)
            matrices[name] = lora.Matrix("F32", shape, values.tobytes())
    path = directory / "rank8.safetensors"
    path.write_bytes(lora.write(matrices))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--alike", action="store_true", help="pad the adapters alike and run the base at alpha 0")
    args = parser.parse_args()
    faulthandler.enable()
    import numpy as np
    import openvino as ov
    import openvino_genai as g

    from workers.engine import lora

    with tempfile.TemporaryDirectory() as tmp:
        paths = {"a": LORA, "b": second_adapter(Path(tmp))}
        if args.alike:
            adapters = {n: g.Adapter(ov.Tensor(np.frombuffer(b, dtype=np.uint8).copy()))
                        for n, b in lora.alike(paths).items()}
        else:
            adapters = {n: g.Adapter(str(p)) for n, p in paths.items()}
    pipe = g.ContinuousBatchingPipeline(str(MODELS / "tiny-llama"), g.SchedulerConfig(), "CPU",
                                        {"adapters": g.AdapterConfig(list(adapters.values()),
                                                                     g.AdapterConfig.Mode.MODE_DYNAMIC)})
    base = g.AdapterConfig(adapters["a"], 0.0) if args.alike else g.AdapterConfig()
    configs = {None: base, "a": g.AdapterConfig(adapters["a"], 0.7), "b": g.AdapterConfig(adapters["b"], 1.0)}
    rng = random.Random(args.seed)
    request_id = done = 0
    while done < args.jobs:
        switch = g.GenerationConfig(max_new_tokens=1)
        switch.adapters = configs[rng.choice([None, "a", "b"])]
        pipe.generate([ov.Tensor(np.asarray([[2]], dtype=np.int64))], [switch])
        handles = []
        for _ in range(rng.randint(1, 8)):
            request_id += 1
            ids = np.asarray([[rng.randrange(3, 300) for _ in range(rng.randint(1, 40))]], dtype=np.int64)
            config = g.GenerationConfig(max_new_tokens=rng.randint(1, 40))
            if rng.random() < 0.5:
                config.do_sample, config.temperature = True, 0.8
            handles.append(pipe.add_request(request_id, ov.Tensor(ids), config))
        while pipe.has_non_finished_requests():
            pipe.step()
            if handles and rng.random() < 0.05:
                handles.pop(rng.randrange(len(handles))).cancel()
        pipe.step()  # frees what cancelled requests held
        done += len(handles) or 1
    print(f"no crash in {args.jobs} jobs (seed {args.seed}, {'alike' if args.alike else 'as given'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
