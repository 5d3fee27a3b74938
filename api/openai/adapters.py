"""Which model, and which of its LoRA adapters, a request's `model` names: `MODEL:ADAPTER`, or the adapter's
declared name alone (as vLLM serves `--lora-modules`), or a plain model. Adapters are the models file's (on the
card) and those loaded at run time (`api/openai/lora.py`)."""
from __future__ import annotations

from api.queue.registry import Registry


async def resolve(registry: Registry, name: str) -> tuple[str, str | None]:
    """(model, adapter or None); a name that is neither a model nor an adapter comes back as it is (its 404 is
    the registry's)."""
    if name in registry.expected or await registry.cards(name):
        return name, None
    base, colon, adapter = name.rpartition(":")
    if colon and base:
        cards = await registry.cards(base)
        if cards and adapter in await registry.adapters(base, next(iter(cards.values()))):
            return base, adapter
    for model, card in (await registry.models()).items():
        if card is not None and name in await registry.adapters(model, card):
            return model, name
    return name, None


def adapter_names(model: str, adapters: list[str]) -> list[str]:
    """What /v1/models lists for a model's adapters."""
    return [f"{model}:{adapter}" for adapter in adapters]
