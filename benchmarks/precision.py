#!/usr/bin/env python3
"""What inference precision costs and what it buys, side by side in one run.

Three arms of OpenVINO's CPU plugin, each a `plugin_config` an operator can put in the models file:
  default  nothing asked: bf16 on a CPU with AVX-512 BF16 or AMX, f32 elsewhere (with dynamic quantization)
  f32      {"INFERENCE_PRECISION_HINT": "f32"}
  exact    {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}: no int8 rounding of
           activations either (the CPU plugin applies it to models with compressed weights, SmolLM2's Q4_1)

Speed (the default model, SmolLM2-135M, in GenAI's own `ContinuousBatchingPipeline`, in this process): 16 greedy
streams of N tokens added at once, tokens/s and TTFT p50 per arm; arms alternate (A B C A B C ...) so a drift of
the machine weighs on each; the ratio is against the default arm's mean. The same for the embeddings model the
tests use (tests/models/tiny-embed: texts/s for batches of 32).

Takeover (what a worker's death does to greedy text): each prompt decoded alone to N tokens, then again cut at a
point and continued by a fresh request whose input is the prompt plus the ids decoded so far (what a continuing
worker prefills): the share of continuations that equal the uninterrupted text, per arm.

  python benchmarks/precision.py                   # 128 tokens, 2 rounds, 3 prompts x 3 cut points (~3 min)
  python benchmarks/precision.py --tokens 300 --rounds 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARMS: dict[str, dict[str, Any]] = {
    "default": {},
    "f32": {"INFERENCE_PRECISION_HINT": "f32"},
    "exact": {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
}
PROMPTS = ["Tell me about the history of Paris.", "Write a short story about a robot who learns to paint.",
           "Explain how a bicycle works."]


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    prompt = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(prompt, add_special_tokens=False).input_ids.data[0].tolist()


def pipeline(model: Path, properties: dict[str, Any]) -> Any:
    import openvino_genai as g

    scheduler = g.SchedulerConfig()
    scheduler.cache_size = 0
    return g.ContinuousBatchingPipeline(str(model), scheduler, "CPU", dict(properties))


def greedy(tokens: int) -> Any:
    import openvino_genai as g

    config = g.GenerationConfig()
    config.max_new_tokens, config.ignore_eos = tokens, True
    return config


def tensor(ids: list[int]) -> Any:
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.asarray([ids], dtype=np.int64))


def streams(pipe: Any, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """16 streams at once: (tokens/s over the run, TTFT p50 in seconds)."""
    start = time.perf_counter()
    handles = [pipe.add_request(i, tensor(ids), greedy(tokens)) for i, ids in enumerate(prompts)]
    first: dict[int, float] = {}
    while pipe.has_non_finished_requests():
        pipe.step()
        now = time.perf_counter()
        for i, handle in enumerate(handles):
            if i not in first and handle.can_read():
                first[i] = now - start
    elapsed = time.perf_counter() - start
    return len(prompts) * tokens / elapsed, statistics.median(first.values())


def alone(pipe: Any, ids: list[int], tokens: int) -> list[int]:
    handle = pipe.add_request(0, tensor(ids), greedy(tokens))
    while pipe.has_non_finished_requests():
        pipe.step()
    return list(handle.read_all()[0].generated_ids)


def takeover(pipe: Any, prompts: list[list[int]], tokens: int) -> tuple[int, int, list[int]]:
    """(continuations equal to the uninterrupted ids, continuations tried, for each that differs: how many tokens
    after the cut it first differs)."""
    same, tried, diverged = 0, 0, []
    for ids in prompts:
        whole = alone(pipe, ids, tokens)
        for cut in (tokens // 8, tokens // 3, tokens // 2):
            rest = alone(pipe, ids + whole[:cut], tokens - cut)
            tried += 1
            if whole[cut:] == rest:
                same += 1
            else:
                diverged.append(next(i for i, (a, b) in enumerate(zip(whole[cut:], rest, strict=False)) if a != b))
    return same, tried, diverged


def embeddings(properties: dict[str, Any], rounds: int) -> float:
    import openvino_genai as g

    pipe = g.TextEmbeddingPipeline(str(ROOT / "tests" / "models" / "tiny-embed"), "CPU",
                                   g.TextEmbeddingPipeline.Config(), **properties)
    texts = [f"document number {i} about the capital of France and its history" for i in range(32)]
    pipe.embed_documents(texts)  # warm
    start = time.perf_counter()
    for _ in range(rounds):
        pipe.embed_documents(texts)
    return 32 * rounds / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import openvino as ov
    import openvino_genai as g

    from common.models.prepare import prepare
    from common.models.sources import default_model
    from common.settings import Settings

    model = prepare(default_model(Settings()))
    tokenizer = g.Tokenizer(str(model))
    prompts = [chat_ids(tokenizer, f"{PROMPTS[i % 3]} (variant {i})") for i in range(16)]
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    print(f"CPU default inference precision: {default}; {args.tokens} tokens, {args.rounds} rounds")
    pipes = {arm: pipeline(model, props) for arm, props in ARMS.items()}
    speed: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    embed: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for pipe in pipes.values():
        streams(pipe, prompts[:2], 4)  # warm
    for _ in range(args.rounds):
        for arm, pipe in pipes.items():
            speed[arm].append(streams(pipe, prompts, args.tokens))
            embed[arm].append(embeddings(ARMS[arm], 20))
    base_tps = statistics.mean(t for t, _ in speed["default"])
    base_ttft = statistics.mean(f for _, f in speed["default"])
    base_embed = statistics.mean(embed["default"])
    print(f"\n{'arm':8} {'tok/s':>8} {'ratio':>6} {'TTFT p50':>9} {'ratio':>6} {'embed/s':>8} {'ratio':>6}"
          f"   takeover: continuations equal (first differing token after the cut)")
    for arm, pipe in pipes.items():
        tps = statistics.mean(t for t, _ in speed[arm])
        ttft = statistics.mean(f for _, f in speed[arm])
        emb = statistics.mean(embed[arm])
        same, tried, diverged = takeover(pipe, [chat_ids(tokenizer, p) for p in PROMPTS], args.tokens)
        print(f"{arm:8} {tps:8.1f} {tps / base_tps:6.2f} {ttft * 1000:7.0f}ms {ttft / base_ttft:6.2f} "
              f"{emb:8.1f} {emb / base_embed:6.2f}   {same}/{tried} {diverged}")


if __name__ == "__main__":
    main()
