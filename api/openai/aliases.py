"""Requests for an alias of the models file go to one of its targets (common/models/aliases.py): by the hash of the
conversation's key (`prompt_cache_key`, else `user`) when the request names one, so a conversation stays on one
model in every API process; else dealt by weight. The request then names the target: its answer's `model`, its
job, its metrics are the target's."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.models.aliases import Alias, Dealer


def conversation_key(data: dict[str, Any]) -> str | None:
    """What keeps a conversation on one target: OpenAI's `prompt_cache_key`, else `user`."""
    for field in ("prompt_cache_key", "user"):
        value = data.get(field)
        if isinstance(value, str) and value:
            return value
    return None


class AliasRoutes:
    """This process's aliases (replaced on reload) and their keyless dealers."""

    def __init__(self, aliases: list[Alias], counted: Callable[[str, str], None] | None = None) -> None:
        self._counted = counted
        self._aliases: dict[str, Alias] = {}
        self._dealers: dict[str, Dealer] = {}
        self.apply(aliases)

    def apply(self, aliases: list[Alias]) -> None:
        """A reloaded models file's aliases; an alias whose weights stand keeps its dealer's place."""
        dealers = {}
        for alias in aliases:
            kept = self._dealers.get(alias.name)
            dealers[alias.name] = kept if kept is not None and kept.alias == alias else Dealer(alias)
        self._aliases = {alias.name: alias for alias in aliases}
        self._dealers = dealers

    @property
    def names(self) -> list[str]:
        return list(self._aliases)

    def __bool__(self) -> bool:
        return bool(self._aliases)

    def route(self, name: str, key: str | None) -> str | None:
        """The target for a request naming `name`; None when `name` is no alias."""
        alias = self._aliases.get(name)
        if alias is None:
            return None
        target = alias.by_key(key) if key is not None else self._dealers[name].next()
        if self._counted is not None:
            self._counted(name, target)
        return target
