"""From a job's request values and the model's defaults to the engine's generation settings."""
from __future__ import annotations

import random
from typing import Any

from common.errors import OvqError
from common.jobs import SamplingParams

# Used when neither the request nor the model's generation_config.json says: OpenAI's own defaults.
BUILTIN_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "rng_seed")


def prompt_param(kind: str) -> str:
    """The request field a job's prompt came from: what a 400 about the prompt names."""
    return "prompt" if kind == "completion" else "messages"


def token_budget(params: SamplingParams, defaults: dict[str, Any], prompt_tokens: int, context: int,
                 param: str = "messages") -> int:
    """max_new_tokens for this job, or a 400 when the prompt (plus what was asked for) does not fit; `param`
    is the prompt's field (prompt_param)."""
    room = context - prompt_tokens
    if room <= 0:
        raise OvqError(
            f"This model's maximum context length is {context} tokens. However, your prompt resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the prompt.",
            param=param,
            code="context_length_exceeded",
        )
    if params.max_tokens is None:
        return min(int(defaults.get("max_tokens") or room), room)
    if params.max_tokens > room:
        raise OvqError(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + params.max_tokens} tokens ({prompt_tokens} in the prompt, {params.max_tokens} for "
            "the completion). Please reduce the length of the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return params.max_tokens


def engine_config(params: SamplingParams, defaults: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """A plain dict the engine turns into `openvino_genai.GenerationConfig` (it crosses a process boundary)."""
    merged = {**BUILTIN_DEFAULTS, **defaults, **params.model_dump(exclude_none=True)}
    temperature = float(merged["temperature"])
    config: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0}
    if temperature > 0:
        config.update(temperature=temperature, top_p=float(merged["top_p"]))
        if (merged.get("top_k") or 0) > 0:
            config["top_k"] = int(merged["top_k"])
        if merged.get("min_p"):
            config["min_p"] = float(merged["min_p"])
        if params.seed is not None:
            config["rng_seed"] = params.seed
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos", "length_penalty",
                 "num_assistant_tokens", "max_ngram_size", "assistant_confidence_threshold"):
        if name in merged:
            config[name] = merged[name]
    if params.stop:
        # The engine stops on them; the worker's StopFilter removes them from the text (or keeps them, if asked).
        config["stop_strings"] = list(params.stop)
        config["include_stop_str_in_output"] = True
    if params.min_tokens:
        config["min_new_tokens"] = params.min_tokens
    if params.stop_token_ids:
        config["stop_token_ids"] = list(params.stop_token_ids)
    if params.logprobs is not None:
        config["logprobs"] = 1  # GenAI reports the chosen token's log-probability whatever the number
    if params.echo:
        config["echo"] = True
    return config


def check_top_logprobs(params: SamplingParams, config: dict[str, Any]) -> None:
    """GenAI gives only the chosen token's log-probability: it is the most likely one only in greedy decoding."""
    if (params.logprobs or 0) >= 1 and (config.get("do_sample") or config.get("num_beams", 1) > 1):
        raise OvqError("top_logprobs 1 needs greedy decoding (temperature 0, no best_of): the engine reports only "
                       "the chosen token's log-probability", param="top_logprobs")


def choice_configs(params: SamplingParams, defaults: dict[str, Any], max_new_tokens: int) -> list[dict[str, Any]]:
    """One engine request per config: beam search is one request for all `n`; sampling `n` is `n` requests.

    Separate requests (seeds seed, seed+1, ...) stream every choice as it is made; GenAI's own
    `num_return_sequences` hands them out only when all are finished.
    """
    config = engine_config(params, defaults, max_new_tokens)
    if (params.best_of or 1) > 1:
        for name in SAMPLING_ONLY:
            config.pop(name, None)
        config.update(do_sample=False, num_beams=params.best_of, num_return_sequences=params.n)
        check_top_logprobs(params, config)
        return [config]
    check_top_logprobs(params, config)
    if not config["do_sample"]:
        return [dict(config) for _ in range(params.n)]
    # Unseeded sampling gets a random seed: GenAI's default seed would make equal requests give equal answers.
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    return [{**config, "rng_seed": (seed + i) % 2**32} for i in range(params.n)]
