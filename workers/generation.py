"""From a job's request values and the model's defaults to the engine's generation settings."""
from __future__ import annotations

from typing import Any

from common.errors import OvqError
from common.jobs import SamplingParams

# Used when neither the request nor the model's generation_config.json says: OpenAI's own defaults.
BUILTIN_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}


def token_budget(params: SamplingParams, defaults: dict[str, Any], prompt_tokens: int, context: int) -> int:
    """max_new_tokens for this job, or a 400 when the prompt (plus what was asked for) does not fit."""
    room = context - prompt_tokens
    if room <= 0:
        raise OvqError(
            f"This model's maximum context length is {context} tokens. However, your prompt resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the prompt.",
            param="messages",
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
        if params.seed is not None:
            config["rng_seed"] = params.seed
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos"):
        if name in merged:
            config[name] = merged[name]
    if params.stop:
        # The engine stops on them; the worker's StopFilter removes them from the text.
        config["stop_strings"] = list(params.stop)
        config["include_stop_str_in_output"] = True
    return config
