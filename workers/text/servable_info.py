"""The worker's view of its model directory: tokenizer, model card, generation defaults."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.modelcard import ModelCard
from common.models.config import ModelConfig
from common.models.parser_choice import reasoning_parser_for, tool_parser_for
from common.servable import (
    ServableType,
    chat_template,
    context_length,
    eos_ids,
    generation_defaults,
    infer_servable,
    special_tokens,
    vocab_size,
)
from workers.engine.generation import BUILTIN_DEFAULTS

ANNOUNCED = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
# Servables whose engine is the ContinuousBatchingPipeline: the ones a draft model can assist.
CONTINUOUS = (ServableType.LM_CB, ServableType.VLM_CB)


def model_defaults(model: ModelConfig, path: Path) -> dict[str, Any]:
    """Request values for requests that set none: the models file's sampling_defaults, under the directory's
    generation_config.json, under the models file's max_tokens_default; max_tokens_limit caps max_tokens and is
    also its default when nothing else sets one (as in OVMS)."""
    defaults = {**model.sampling_defaults, **generation_defaults(path)}
    if model.max_tokens_default is not None:
        defaults["max_tokens"] = model.max_tokens_default
    limit = model.max_tokens_limit
    if limit is not None:
        defaults["max_tokens"] = min(defaults.get("max_tokens") or limit, limit)
    return defaults


def announced_sampling(defaults: dict[str, Any]) -> dict[str, float]:
    """What the model card tells of the sampling a request that sets none gets (the engine's own merge)."""
    merged = {**BUILTIN_DEFAULTS, "presence_penalty": 0.0, "frequency_penalty": 0.0, **defaults}
    return {name: float(merged[name]) for name in ANNOUNCED if isinstance(merged.get(name), (int, float))}


@dataclass
class ServableInfo:
    tokenizer: Any
    card: ModelCard
    defaults: dict[str, Any]
    vocab_size: int | None
    path: Path

    @classmethod
    def load(cls, path: Path, model: ModelConfig, device: str) -> ServableInfo:
        import openvino_genai

        # One inference thread: the engine process has the cores; a batched decode per step needs little.
        tokenizer = openvino_genai.Tokenizer(str(path), INFERENCE_NUM_THREADS=1)
        bos, eos = special_tokens(path, tokenizer.get_bos_token(), tokenizer.get_eos_token())
        vocab = vocab_size(path)
        servable = infer_servable(path, device, model.pipeline_type)
        template = chat_template(path, tokenizer.chat_template, model.chat_template)
        card = ModelCard(
            name=model.name,
            device=device,
            servable_type=servable,
            context_length=context_length(path),
            vocab_size=vocab,
            max_tokens_limit=model.max_tokens_limit,
            best_of_limit=model.best_of_limit,
            chat_template=template,
            bos_token=bos,
            eos_token=eos,
            created=int(path.stat().st_mtime) if path.exists() else int(time.time()),
            preference=model.devices.index(device) if device in model.devices else len(model.devices),
            tool_parser=model.tool_parser or tool_parser_for(template),
            reasoning_parser=model.reasoning_parser or reasoning_parser_for(template),
            enable_tool_guided_generation=model.enable_tool_guided_generation,
            prompt_lookup=bool(model.plugin_config.get("prompt_lookup")),
            speculative=model.draft_models_path is not None and servable in CONTINUOUS,
            adapters=sorted(model.lora_adapters) if servable in CONTINUOUS else [],
            prefix_caching=model.enable_prefix_caching and servable in CONTINUOUS,
        )
        defaults = model_defaults(model, path)
        card.sampling = announced_sampling(defaults)
        return cls(tokenizer, card, defaults, vocab, path)

    def decode(self, sequences: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return self.tokenizer.decode(sequences, skip_special_tokens=skip_special_tokens)

    def end_ids(self) -> set[int]:
        """Ids that end an answer: the tokenizer's EOS and generation_config.json's `eos_token_id`(s)."""
        ids = {self.tokenizer.get_eos_token_id()}
        ids.update(eos_ids(self.path))
        return {i for i in ids if i is not None and i >= 0}
