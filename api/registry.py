"""Which models exist, what they accept, and which device stream a new job goes to."""
from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from common.errors import OvqError, not_found, unavailable
from common.keys import Keys
from common.modelcard import ModelCard
from common.settings import Settings

CARD_CACHE_S = 1.0


@dataclass
class Route:
    card: ModelCard
    stream: str


class Registry:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings, expected: list[str]) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self.expected = expected
        self._cards: dict[str, tuple[float, dict[str, ModelCard]]] = {}

    async def cards(self, model: str) -> dict[str, ModelCard]:
        """Device -> card, as the model's workers last announced it (cached for a second)."""
        cached = self._cards.get(model)
        if cached and time.monotonic() - cached[0] < CARD_CACHE_S:
            return cached[1]
        raw = await self.redis.hgetall(self.keys.model(model))
        cards = {d.decode(): ModelCard.model_validate_json(v) for d, v in raw.items()}
        self._cards[model] = (time.monotonic(), cards)
        return cards

    async def models(self) -> dict[str, ModelCard | None]:
        names = {m.decode() for m in await self.redis.smembers(self.keys.models)} | set(self.expected)
        listed: dict[str, ModelCard | None] = {}
        for name in sorted(names):
            cards = await self.cards(name)
            if cards or name in self.expected:
                listed[name] = next(iter(cards.values()), None)
        return listed

    async def live_workers(self, model: str, devices: list[str]) -> dict[str, int]:
        since = time.time() - self.settings.worker_ttl_s
        pipe = self.redis.pipeline(transaction=False)
        for device in devices:
            pipe.zcount(self.keys.workers(model, device), since, "+inf")
        return dict(zip(devices, await pipe.execute(), strict=False))

    async def route(self, model: str) -> Route:
        """The device stream with the shortest backlog among those with a live worker (ties: first announced)."""
        cards = await self.cards(model)
        if not cards:
            if model in self.expected:
                raise unavailable(f"The model `{model}` is not being served by any worker right now")
            raise not_found(f"The model `{model}` does not exist")
        devices = list(cards)
        since = time.time() - self.settings.worker_ttl_s
        pipe = self.redis.pipeline(transaction=False)
        for device in devices:
            pipe.zcount(self.keys.workers(model, device), since, "+inf")
            pipe.xlen(self.keys.jobs(model, device))
        replies = await pipe.execute()
        candidates = [(replies[2 * i + 1], i, d) for i, d in enumerate(devices) if replies[2 * i]]
        if not candidates:
            raise unavailable(f"The model `{model}` is not being served by any worker right now")
        backlog, _, device = min(candidates)
        if backlog >= self.settings.max_queue_depth:
            error = OvqError(f"The model `{model}` is overloaded; retry later", 429, "rate_limit_error",
                             code="queue_full")
            raise error
        return Route(cards[device], self.keys.jobs(model, device))

    async def ready(self) -> dict[str, bool]:
        names = self.expected or sorted(m.decode() for m in await self.redis.smembers(self.keys.models))
        status = {}
        for name in names:
            devices = list(await self.cards(name))
            status[name] = any((await self.live_workers(name, devices)).values()) if devices else False
        return status
