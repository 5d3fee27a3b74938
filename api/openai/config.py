"""Configuration without a restart, in an API process: it follows its models file (or OVMS config.json), and
answers OVMS's `POST /v1/config/reload` and `GET /v1/config` (admin routes).

Each process reads its own copy of the file (`common/models/watch.py`): the file is the source of truth, as a
ConfigMap every host mounts is. A reload asked of one process bumps the fleet's reload generation in Redis
(`Keys.config_generation`), so every other API process, worker and `ovq serve` reads its file at once rather than
at its next stat change (which also covers `OVQ_CONFIG_POLL_S=0` and graph.pbtxt edits). What it applies: the
models that exist (a removed one is a 404 at once, its queued and running jobs finish: its workers drain), their
devices (for the awaiting list), and the aliases.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis.asyncio as aioredis
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from api.openai.aliases import AliasRoutes
from api.queue.registry import Registry
from common import tasks
from common.errors import OvqError
from common.keys import Keys
from common.models.watch import Change, ConfigWatch
from common.redis.client import UNAVAILABLE
from common.settings import Settings

log = logging.getLogger("ovq.api")
RETIRED_KEPT = 100  # removed models GET /v1/config still lists (UNLOADING, then END), the latest first


class ConfigFollower:
    def __init__(self, watch: ConfigWatch | None, registry: Registry, aliases: AliasRoutes, redis: aioredis.Redis,
                 keys: Keys, settings: Settings) -> None:
        self.watch, self.registry, self.aliases = watch, registry, aliases
        self.redis, self.keys, self.settings = redis, keys, settings
        self.retired: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> ConfigFollower:
        if self.watch is not None and self.watch.path is not None and self.settings.config_poll_s > 0:
            self.watch.heard(await self._generation())
            self._task = asyncio.create_task(self._follow(), name="config")
        return self

    async def stop(self) -> None:
        await tasks.stop(self._task)

    async def _generation(self) -> int | None:
        try:
            value = await self.redis.get(self.keys.config_generation)
        except UNAVAILABLE:  # Redis away: the file's own stat still counts; the generation is read next time
            return None
        return int(value) if value is not None else 0

    async def _follow(self) -> None:
        assert self.watch is not None
        while True:
            await asyncio.sleep(self.settings.config_poll_s)
            generation = await self._generation()
            force = self.watch.heard(generation)
            self.apply(self.watch.poll(force))

    def apply(self, change: Change) -> None:
        if not change:
            return
        catalog = change.catalog
        if self.registry.configured:
            self.registry.apply(catalog.names, {m.name: m.devices for m in catalog.models})
            self.retired = ([n for n in change.removed] + [n for n in self.retired if n not in catalog.names])
            del self.retired[RETIRED_KEPT:]
        self.aliases.apply(catalog.aliases)

    async def reload(self) -> Change | None:
        """Read the file now and apply it; tell the fleet (its generation). None without a file to read."""
        if self.watch is None or self.watch.path is None:
            return None
        change = self.watch.poll(force=True)
        if self.watch.error is not None:
            raise OvqError(f"Reloading the configuration failed; the last good one stays: {self.watch.error}", 409,
                           "invalid_request_error", None, "config_invalid")
        self.apply(change)
        generation = await self.redis.incr(self.keys.config_generation)
        self.watch.heard(generation)  # this process has read it
        return change

    async def status(self) -> dict[str, Any]:
        """OVMS's config status: each servable's `model_version_status` (one version, "1")."""
        listed = await self.registry.ready()
        out = {name: _version("AVAILABLE" if live else "LOADING", "OK" if live else "no live worker yet")
               for name, live in listed.items()}
        for name in self.retired:
            if name not in out:
                live = bool(self.registry.configured and await self._live(name))
                out[name] = _version("UNLOADING" if live else "END", "draining" if live else "OK")
        return out

    async def _live(self, model: str) -> bool:
        devices = list(await self.registry.cards(model))
        return bool(devices) and any((await self.registry.live_workers(model, devices)).values())


def _version(state: str, message: str) -> dict[str, Any]:
    return {"model_version_status": [{"version": "1", "state": state,
                                      "status": {"error_code": "OK", "error_message": message}}]}


router = APIRouter(include_in_schema=False)


@router.get("/config")
async def config_status(request: Request) -> JSONResponse:
    """OVMS's Config Status API."""
    return JSONResponse(await request.app.state.config.status())


@router.post("/config/reload")
async def config_reload(request: Request) -> JSONResponse:
    """OVMS's Config Reload API: 201 when something changed, 200 when nothing did (or there is no file to read),
    each with the config status after it."""
    follower: ConfigFollower = request.app.state.config
    change = await follower.reload()
    return JSONResponse(await follower.status(), status_code=201 if change else 200)
