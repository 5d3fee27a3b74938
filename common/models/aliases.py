"""Weighted aliases of the models file (`aliases: {chat: {model-a: 90, model-b: 10}}`): a name requests use that
stands for several models, each taking its weight's share (a canary, a migration).

Which target a request gets is decided here from the request alone, so every API process decides the same with no
state shared: a request that names its conversation (`prompt_cache_key`, else `user`) goes where a hash of that key
falls on the weights, and stays there while the weights stand; a keyless one is dealt by `Dealer`."""
from __future__ import annotations

import hashlib
from itertools import accumulate

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.models.config import ConfigError, ModelConfig

HASH_SPACE = 2**64


class Alias(BaseModel):
    """One alias: its targets (model names of the same file) and their integer weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    weights: dict[str, int] = Field(min_length=1)

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, int]) -> dict[str, int]:
        if any(weight < 0 for weight in value.values()):
            raise ValueError("weights are integers >= 0")
        if not sum(value.values()):
            raise ValueError("at least one weight above 0")
        return value

    @property
    def live(self) -> list[tuple[str, int]]:
        """The targets with a weight above 0, in the file's order."""
        return [(target, weight) for target, weight in self.weights.items() if weight > 0]

    def by_key(self, key: str) -> str:
        """The target a conversation key falls on: the key's hash (sha256 of alias and key: the same in every
        process and release) placed on the cumulative weights. Changing one weight moves only the keys between
        the old and the new boundary."""
        digest = hashlib.sha256(f"{self.name}\0{key}".encode()).digest()
        point = int.from_bytes(digest[:8], "big") * sum(w for _, w in self.live) // HASH_SPACE
        for (target, _), bound in zip(self.live, accumulate(w for _, w in self.live), strict=True):
            if point < bound:
                return target
        return self.live[-1][0]  # not reached: point < total


class Dealer:
    """Keyless requests of one alias, dealt by smooth weighted round robin (nginx's): over every run of
    sum(weights) requests each target gets exactly its weight, interleaved (90/10 is never 90 in a row). Per
    process: with N API processes each deals its own share, so the fleet's split is the weights' too."""

    def __init__(self, alias: Alias) -> None:
        self.alias = alias
        self._current = {target: 0 for target, _ in alias.live}

    def next(self) -> str:
        total = sum(w for _, w in self.alias.live)
        for target, weight in self.alias.live:
            self._current[target] += weight
        chosen = max(self._current, key=lambda t: self._current[t])  # first of the file's order on ties
        self._current[chosen] -= total
        return chosen


def read_aliases(raw: object, models: list[ModelConfig], source: str) -> list[Alias]:
    """The `aliases` section of a models file, checked against its models: each target is a model of the file,
    and no alias has a model's name."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: aliases is a mapping of alias name to {{model: weight}}")
    names = {m.name for m in models}
    aliases = []
    for name, weights in raw.items():
        if name in names:
            raise ConfigError(f"{source}: alias {name!r} has the name of a model")
        if not isinstance(weights, dict) or not all(isinstance(w, int) and not isinstance(w, bool)
                                                    for w in weights.values()):
            raise ConfigError(f"{source}: alias {name!r}: targets are {{model: integer weight}}")
        unknown = sorted(set(weights) - names)
        if unknown:
            raise ConfigError(f"{source}: alias {name!r} names {', '.join(unknown)}, not a model of this file")
        try:
            aliases.append(Alias(name=str(name), weights=weights))
        except ValueError as exc:
            raise ConfigError(f"{source}: alias {name!r}: {exc}") from None
    return aliases
