"""The API's server: checks what it needs before it binds (models file, keys, exposure, Redis), then uvicorn."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

import uvicorn

from api.http.auth import KeyFileError, exposure_refusal, is_loopback, load_keys
from common.models.config import ConfigError
from common.models.sources import configured_models
from common.redis.client import RedisRefused, RedisURLError, connect, redis_url, wait_until_up
from common.settings import Settings, get_settings
from common.signals import EarlySignals


def api_processes(settings: Settings) -> int:
    """OVQ_API_PROCESSES, else one per four cores (at least one): workers, not the API, should set the limit."""
    return settings.api_processes or max(1, min(8, (os.cpu_count() or 1) // 4))


async def _wait_for_redis(settings: Settings) -> None:
    client = connect(settings, max_connections=1)
    try:
        await wait_until_up(client, redis_url(settings), settings.redis_wait_s, "ovq api")
    finally:
        await client.aclose()


def serve(signals: EarlySignals) -> int:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        configured_models(settings)  # one line here for a broken models file, not a traceback per process
        keys = load_keys(settings)
        refusal = exposure_refusal(settings, keys)
        if refusal:
            print(f"ovq api: {refusal}", file=sys.stderr)
            return 2
        redis_url(settings)
        asyncio.run(_wait_for_redis(settings))
    except (ConfigError, RedisURLError, RedisRefused, KeyFileError) as exc:
        print(f"ovq api: {exc}", file=sys.stderr)
        return 2
    except TimeoutError as exc:
        print(f"ovq api: {exc}; exiting", file=sys.stderr)
        return 1
    if not keys[0] and not is_loopback(settings.host):
        logging.getLogger("ovq.api").warning("serving on %s with OVQ_ALLOW_UNAUTHENTICATED: no API key is asked for",
                                             settings.host)
    # uvicorn re-raises the stop signal once it has drained, to die by it; the drain is the intended end: exit 0.
    signals.hand_over()
    uvicorn.run("api.app:create_app", factory=True, host=settings.host, port=settings.port,
                workers=api_processes(settings), log_level=settings.log_level, access_log=False,
                timeout_graceful_shutdown=int(settings.shutdown_grace_s), timeout_keep_alive=settings.keep_alive_s,
                http="api.http.timeouts:GuardedHttpToolsProtocol")
    return 0
