"""How every tier reaches Redis: one URL rule, a bounded blocking pool, and a start-up wait with backoff."""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from common.errors import OvqError
from common.settings import Settings

log = logging.getLogger("ovq.redis")

# Errors that mean "Redis is not there right now" (restarting, unreachable, loading its data), not a bug.
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError, OSError)


class RedisURLError(ValueError):
    pass


def _refused_with(exc: BaseException, code: str) -> bool:
    """Whether Redis answered with the error `code`, itself or from inside a script ("...: @user_script:3: CODE")."""
    return isinstance(exc, ResponseError) and re.search(rf"(?:^|: ){code} ", str(exc)) is not None


def is_nogroup(exc: BaseException) -> bool:
    """Redis lost a stream's consumer group (restarted without its data): the worker creates it again."""
    return _refused_with(exc, "NOGROUP")


def is_busygroup(exc: BaseException) -> bool:
    """The consumer group exists already."""
    return _refused_with(exc, "BUSYGROUP")


def redis_away() -> OvqError:
    """The answer to a request whose job queue (Redis) went away while it ran: the client may retry."""
    return OvqError("The job queue (Redis) became unreachable while this request ran; retry shortly", 503,
                    "service_unavailable", code="service_unavailable")


def embedded_socket(settings: Settings) -> Path:
    """Where `ovq redis` and `ovq serve`'s embedded Redis listen: the tiers' default when REDIS_URL is unset."""
    return settings.cache_dir / "redis" / "redis.sock"


def redis_url(settings: Settings) -> str:
    """REDIS_URL, else the embedded Redis's socket; a malformed URL is a RedisURLError with a one-line reason."""
    url = settings.redis_url or f"unix://{embedded_socket(settings)}?db=0"
    scheme = urlparse(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise RedisURLError(f"REDIS_URL must start with redis://, rediss:// or unix://, not {url!r}")
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise RedisURLError(f"REDIS_URL {url!r} is malformed: {exc}") from None
    return url


def describe(url: str) -> str:
    """HOST:PORT (or the socket path) without credentials, for log lines."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return parsed.path
    return f"{parsed.hostname or 'localhost'}:{parsed.port or 6379}"


def reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lowered = text.lower()
    for marker in ("connection refused", "no such file or directory", "timeout", "name or service not known",
                   "authentication", "loading"):
        if marker in lowered:
            return marker
    return text.splitlines()[0][:200]


def _no_client_info() -> dict[str, object]:
    """No CLIENT SETINFO nor CLIENT MAINT_NOTIFICATIONS on each new connection: round trips saved, and an ACL
    user need not be allowed CLIENT (Redis 6.2, which has neither subcommand, logs each as a denied command).
    redis-py 8 names these options `driver_info` and `maint_notifications_config`."""
    accepted = inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    if "driver_info" not in accepted:
        return {"lib_name": None, "lib_version": None}
    options: dict[str, object] = {"driver_info": None}
    if "maint_notifications_config" in accepted:
        from redis.maint_notifications import MaintNotificationsConfig

        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return options


NO_CLIENT_INFO = _no_client_info()


def connect(settings: Settings, max_connections: int | None = None) -> aioredis.Redis:
    """A client whose pool blocks (bounded) instead of failing when every connection is busy, and which
    retries a command once on a fresh connection (a stale pooled one after a Redis restart is not an error)."""
    url = redis_url(settings)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections or settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s, socket_connect_timeout=settings.redis_timeout_s,
        health_check_interval=30, **NO_CLIENT_INFO,
    )
    return aioredis.Redis(connection_pool=pool, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1),
                          retry_on_error=[redis.ConnectionError, redis.TimeoutError])


def connect_sync(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(redis_url(settings), socket_connect_timeout=settings.redis_timeout_s, **NO_CLIENT_INFO)


async def wait_until_up(client: aioredis.Redis, url: str, max_wait_s: float, who: str) -> None:
    """PING with exponential backoff and one log line per failed attempt; TimeoutError after `max_wait_s`."""
    deadline = time.monotonic() + max_wait_s
    backoff = Backoff()
    while True:
        try:
            await client.ping()
            return
        except UNAVAILABLE as exc:
            why = reason(exc)
            if time.monotonic() + backoff.delay > deadline:
                raise TimeoutError(f"Redis at {describe(url)} unreachable for {max_wait_s:.0f}s: {why}") from None
            log.warning("%s waiting for Redis at %s: %s (retry in %.1fs)", who, describe(url), why, backoff.delay)
            await backoff.wait()


class Backoff:
    """Doubling delays, capped, for a loop that retries until something answers: `wait()` after each failure,
    `reset()` after a success. `failed`/`succeeded` do the same with one log line per attempt, for the loop that
    speaks for the others."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap = first, cap
        self.delay = first  # the next wait
        self.failures = 0  # since the last reset

    def next(self) -> float:
        """The delay to wait now (counted as a failure); the one after it doubles."""
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        self.failures += 1
        return delay

    async def wait(self) -> None:
        await asyncio.sleep(self.next())

    def reset(self) -> None:
        self.delay, self.failures = self.first, 0

    def failed(self, logger: logging.Logger, what: str, exc: BaseException) -> float:
        delay = self.next()
        logger.warning("%s: Redis unavailable (%s); retry %d in %.1fs", what, reason(exc), self.failures, delay)
        return delay

    def succeeded(self, logger: logging.Logger, what: str) -> None:
        if self.failures:
            logger.warning("%s: Redis is back after %d retries", what, self.failures)
        self.reset()
