#!/usr/bin/env python3
"""Speculative decoding: what a draft model does to a served model's greedy decoding, as ovq's engine runs it.

One `ContinuousBatchingPipeline` per variant (the engine's, `workers/engine/continuous.py`: the draft is passed as
`draft_model` with its own scheduler config), the same greedy chat prompts, alternated A/B for `--rounds` rounds on
this machine's noise, reporting tokens/s, the speed-up and GenAI's own draft acceptance rate (accepted draft tokens /
drafted tokens, from `SDPerModelsPerfMetrics`). It also checks the drafted text is the plain text.

Pairs:
  tiny     the tiny Llama drafted by its first layer (tests/models): shows the mechanics, random weights.
  smollm2  SmolLM2-135M-Instruct drafted by itself: no smaller model with its tokenizer is here, so the
           acceptance rate is ~1 and the speed-up is what the draft's own cost leaves (below 1 here).

  python benchmarks/speculative.py                  # both pairs, 3 rounds, 4 prompts x 64 tokens
  python benchmarks/speculative.py --pair tiny --draft-tokens 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "tiny": (ROOT / "tests/models/tiny-llama", ROOT / "tests/models/tiny-llama-draft"),
    "smollm2": (Path.home() / ".cache/ovq/models/smollm2-135m-instruct",) * 2,
}
PROMPTS = ["What is the capital of France?", "Tell me a short story about a cat.", "How are you today?",
           "Explain what a queue is in one paragraph."]


def pipeline(model: Path, draft: Path | None, threads: int):
    import openvino_genai as g

    def scheduler():
        config = g.SchedulerConfig()
        config.cache_size = 0
        return config

    properties: dict = {"INFERENCE_NUM_THREADS": threads}
    if draft is not None:
        properties["draft_model"] = g.draft_model(str(draft), "CPU", scheduler_config=scheduler())
    return g.ContinuousBatchingPipeline(str(model), scheduler(), "CPU", properties)


def run(pipe, tokens: int, draft_tokens: int | None) -> tuple[float, list[str], float | None]:
    """One batch of every prompt (chat-templated); seconds, texts, acceptance rate (drafted runs)."""
    import openvino_genai as g

    config = g.GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    if draft_tokens:
        config.num_assistant_tokens = draft_tokens
    tokenizer = pipe.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
               for p in PROMPTS]
    started = time.perf_counter()
    results = pipe.generate(prompts, [config] * len(prompts))
    seconds = time.perf_counter() - started
    texts = [r.m_generation_ids[0] for r in results]
    metrics = results[0].extended_perf_metrics
    rate = metrics.get_draft_acceptance_rate() if draft_tokens and hasattr(metrics, "get_draft_acceptance_rate") \
        else None
    return seconds, texts, rate


def measure(name: str, rounds: int, tokens: int, draft_tokens: int, threads: int) -> dict:
    model, draft = PAIRS[name]
    plain, drafted = pipeline(model, None, threads), pipeline(model, draft, threads)
    run(plain, 4, None), run(drafted, 4, draft_tokens)  # warm up both
    times: dict[str, list[float]] = {"plain": [], "drafted": []}
    rates: list[float] = []
    same = True
    for _ in range(rounds):  # alternate, so both see the same background load
        seconds, plain_texts, _ = run(plain, tokens, None)
        times["plain"].append(seconds)
        seconds, drafted_texts, rate = run(drafted, tokens, draft_tokens)
        times["drafted"].append(seconds)
        rates.append(rate if rate is not None else float("nan"))
        same = same and plain_texts == drafted_texts
    generated = tokens * len(PROMPTS)
    plain_tps = generated / statistics.median(times["plain"])
    drafted_tps = generated / statistics.median(times["drafted"])
    return {"pair": name, "draft_tokens": draft_tokens, "plain_tok_s": round(plain_tps, 1),
            "drafted_tok_s": round(drafted_tps, 1), "speed_up": round(drafted_tps / plain_tps, 2),
            "acceptance_rate": round(statistics.median(rates), 3), "same_greedy_text": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--draft-tokens", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for name in args.pair or list(PAIRS):
        print(json.dumps(measure(name, args.rounds, args.tokens, args.draft_tokens, args.threads)), flush=True)


if __name__ == "__main__":
    main()
