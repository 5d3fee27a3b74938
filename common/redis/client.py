"""How every tier reaches Redis: one URL rule, a bounded blocking pool, and a start-up wait with backoff."""
from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlparse

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.cluster import RedisCluster
from redis.backoff import ExponentialBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from common.errors import OvqError
from common.keys import Keys
from common.redis.cluster import (
    CLUSTER_SCHEMES,
    FAILING_OVER,
    ClusterURL,
    ClusterURLError,
    connect_cluster,
    describe_cluster,
    initialized,
    is_cluster,
    sync_cluster,
    sync_slot_client,
)
from common.redis.hosts import host_list
from common.redis.transport import guard_pool
from common.settings import Settings

log = logging.getLogger("ovq.redis")

# Errors that mean "Redis is not there right now" (restarting, unreachable, loading its data), not a bug.
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError, OSError,
               *FAILING_OVER)  # a Redis Cluster between a master's death and its replica's promotion


class RedisURLError(ValueError):
    pass


def _refused_with(exc: BaseException, code: str) -> bool:
    """Whether Redis answered with the error `code`, itself or from inside a script ("...: @user_script:3: CODE")."""
    return isinstance(exc, ResponseError) and re.search(rf"(?:^|: ){code} ", str(exc)) is not None


def is_nogroup(exc: BaseException) -> bool:
    """Redis lost a stream's consumer group (restarted without its data): the worker creates it again."""
    return _refused_with(exc, "NOGROUP")


def is_unblocked(exc: BaseException) -> bool:
    """A blocking read ended because its stream is gone: deleted, or MIGRATEd to another master (a Cluster's slot
    resharded). Nothing was read; the next read goes where the slot map now says."""
    return _refused_with(exc, "UNBLOCKED")


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


SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


def redis_url(settings: Settings) -> str:
    """REDIS_URL, else the embedded Redis's socket; a malformed URL is a RedisURLError with a one-line reason."""
    url = settings.redis_url or f"unix://{embedded_socket(settings)}?db=0"
    scheme = urlparse(url).scheme
    if scheme in SENTINEL_SCHEMES:
        SentinelURL.parse(url)
        return url
    if scheme in CLUSTER_SCHEMES:
        try:
            ClusterURL.parse(url)
        except ClusterURLError as exc:
            raise RedisURLError(str(exc)) from None
        return url
    if scheme not in ("redis", "rediss", "unix"):
        raise RedisURLError(f"REDIS_URL must start with redis://, rediss://, unix://, redis+sentinel:// or "
                            f"redis+cluster://, "
                            f"not {url!r}")
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise RedisURLError(f"REDIS_URL {url!r} is malformed: {exc}") from None
    return url


@dataclass(frozen=True)
class SentinelURL:
    """`redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]`
    (`rediss+sentinel://` for TLS to the sentinels and the data nodes). The credentials are the data nodes' (as
    in a redis:// URL); sentinels that want their own give `sentinel_username` / `sentinel_password`."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    sentinel_auth: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # TLS files, timeouts: for the sentinels and the nodes

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        parsed = urlparse(url)
        userinfo, _, hosts = parsed.netloc.rpartition("@")
        username, _, password = userinfo.partition(":")
        try:
            sentinels = host_list(hosts, 26379)
            path = [part for part in parsed.path.split("/") if part]
            db = int(path[1]) if len(path) > 1 else 0
        except ValueError:
            raise RedisURLError(f"REDIS_URL {url!r} is malformed: want host:port,.../service[/db]") from None
        if not sentinels or not path or len(path) > 2:
            raise RedisURLError(f"REDIS_URL {url!r} is malformed: want redis+sentinel://host:port,.../service[/db]")
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        auth = {k.removeprefix("sentinel_"): query.pop(k) for k in ("sentinel_username", "sentinel_password")
                if k in query}
        ssl = parsed.scheme.startswith("rediss")
        try:  # the rest as in a redis:// URL (ssl_ca_certs=..., socket_timeout=...), read by redis-py's own rules
            options = redis.connection.parse_url(f"{'rediss' if ssl else 'redis'}://localhost/0?{urlencode(query)}")
        except ValueError as exc:
            raise RedisURLError(f"REDIS_URL {url!r} is malformed: {exc}") from None
        options = {k: v for k, v in options.items() if k not in ("host", "port", "db", "connection_class")}
        return cls(sentinels, unquote(path[0]), db, unquote(username) or None, unquote(password) or None, ssl, auth,
                   options)

    def node_kwargs(self) -> dict[str, Any]:
        return {"db": self.db, "username": self.username, "password": self.password, **self.options,
                **({"ssl": True} if self.ssl else {})}

    def sentinel_kwargs(self, timeout_s: float) -> dict[str, Any]:
        return {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s, **self.options, **self.sentinel_auth,
                **({"ssl": True} if self.ssl else {}), **NO_CLIENT_INFO}


def is_sentinel(url: str) -> bool:
    return urlparse(url).scheme in SENTINEL_SCHEMES


def keys_for(settings: Settings) -> Keys:
    """The key names for this deployment's Redis: hash-tagged on a Cluster (`Keys.cluster`), plain otherwise."""
    return Keys(settings.key_prefix, cluster=is_cluster(redis_url(settings)))


def replicas_wanted(settings: Settings) -> int:
    """How many replicas must have an enqueued job before the API acknowledges it (`common/redis/replicas.py`)."""
    if settings.redis_wait_replicas is not None:
        return max(settings.redis_wait_replicas, 0)
    url = redis_url(settings)
    return 1 if is_sentinel(url) or is_cluster(url) else 0


def describe(url: str) -> str:
    """HOST:PORT (or the socket path, or the sentinels and the service) without credentials, for log lines."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return parsed.path
    if parsed.scheme in CLUSTER_SCHEMES:
        return describe_cluster(url)
    if parsed.scheme in SENTINEL_SCHEMES:
        target = SentinelURL.parse(url)
        return f"{target.service} via sentinels {','.join(f'{h}:{p}' for h, p in target.sentinels)}"
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


class BlockingSentinelPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The primary a Sentinel names, through a pool that blocks (bounded) as `connect`'s does. Each new connection
    asks the sentinels where the primary is (redis-py's SentinelManagedConnection), so after a failover the next
    connection reaches the new one; while none is known, connecting fails as with Redis down (MasterNotFoundError
    is a ConnectionError); a connection to a primary demoted to replica is dropped on its first READONLY."""


def connect(settings: Settings, max_connections: int | None = None) -> aioredis.Redis:
    """A client whose pool blocks (bounded) instead of failing when every connection is busy, and which
    retries a command once on a fresh connection (a stale pooled one after a Redis restart is not an error)."""
    url = redis_url(settings)
    if is_cluster(url):  # one pool per node, each command routed to its slot's master (common/redis/cluster.py)
        return connect_cluster(url, max_connections or settings.redis_max_connections, settings.redis_timeout_s,
                               **NO_CLIENT_INFO)
    options = {"max_connections": max_connections or settings.redis_max_connections,
               "timeout": settings.redis_pool_timeout_s, "socket_connect_timeout": settings.redis_timeout_s,
               "health_check_interval": 30, **NO_CLIENT_INFO}
    if is_sentinel(url):
        target = SentinelURL.parse(url)
        sentinel = aiosentinel.Sentinel(target.sentinels, sentinel_kwargs=target.sentinel_kwargs(
            settings.redis_timeout_s))
        pool: aioredis.ConnectionPool = BlockingSentinelPool(target.service, sentinel,
                                                             **{**target.node_kwargs(), **options})
    else:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
    return aioredis.Redis(connection_pool=guard_pool(pool), retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1),
                          retry_on_error=[redis.ConnectionError, redis.TimeoutError])


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client for `url` (any scheme `redis_url` accepts), with `options` for its connections."""
    options = {**NO_CLIENT_INFO, **options}
    if is_cluster(url):
        return sync_cluster(url, **options)
    if is_sentinel(url):
        target = SentinelURL.parse(url)
        timeout = options.get("socket_connect_timeout") or 5.0
        sentinel = redis.sentinel.Sentinel(target.sentinels, sentinel_kwargs=target.sentinel_kwargs(timeout))
        return sentinel.master_for(target.service, **{**target.node_kwargs(), **options})
    return redis.Redis.from_url(url, **options)


def connect_sync(settings: Settings) -> redis.Redis:
    return sync_client(redis_url(settings), socket_connect_timeout=settings.redis_timeout_s)


def connect_rq(settings: Settings) -> redis.Redis:
    """rq's connection (the Batch API's queue): `connect_sync`'s, or on a Cluster a plain client on the master that
    owns the slot every rq key shares (`Keys.rq_prefix`; rq runs MULTI and WATCH, which a cluster client cannot)."""
    url = redis_url(settings)
    if is_cluster(url):
        return sync_slot_client(url, keys_for(settings).rq_prefix, socket_connect_timeout=settings.redis_timeout_s)
    return connect_sync(settings)


class RedisRefused(Exception):
    """Redis answered a tier's first commands with an error (NOPERM, ...): a one-line reason at start, no retry."""


async def wait_until_up(client: aioredis.Redis, url: str, max_wait_s: float, who: str) -> None:
    """PING with exponential backoff and one log line per failed attempt; TimeoutError after `max_wait_s`;
    RedisRefused when Redis answers but refuses the connection's first commands (an ACL without them)."""
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
        except ResponseError as exc:  # answered, and said no (not "away"): waiting will not change it
            raise RedisRefused(f"Redis at {describe(url)} refused {who}'s first commands: {exc} (does its ACL user "
                               "allow them? deploy/redis/users.acl lists what each tier runs)") from None


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


async def node_of(client: aioredis.Redis, key: str) -> str:
    """The Redis node `key` lives on, HOST:PORT (or a socket path), for operators: the one Redis, or the primary
    the sentinels named when this client last connected, or, on a Cluster, the master that owns the key's slot."""
    if isinstance(client, RedisCluster):
        try:
            return (await initialized(client)).get_node_from_key(key).name
        except UNAVAILABLE:
            return "(no cluster)"
    pool = client.connection_pool
    if isinstance(pool, aiosentinel.SentinelConnectionPool):
        try:
            host, port = pool.master_address or await pool.get_master_address()
        except UNAVAILABLE:
            return "(no primary)"
        return f"{host}:{port}"
    kwargs = pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}")
