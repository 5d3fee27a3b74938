"""A connection whose socket uvloop has closed is a lost connection (`redis.ConnectionError`), as on asyncio's loop.

uvloop raises RuntimeError ("unable to perform operation on <TCPTransport closed=True ...>; the handler is closed")
when redis-py writes to a transport it has closed; redis-py passes that on as it is, so neither its own retries nor
ovq's `UNAVAILABLE` handlers see Redis gone. It happens whenever a connection is closed under a command about to use
it: a pub/sub health check after a partition healed (benchmarks/chaos.py: a worker's cancel loop died of it), and on
a Cluster whenever a master fails over, because redis-py's cluster pipeline, retrying, closes every connection of
the shared client while other commands are in flight (CI: 30 streams of one API process cut mid-body, each an
"Exception in ASGI application", by the liveness check of their workers during the failover).

On asyncio's own loop the same race leaves the connection with no writer at all (redis-py's `disconnect` sets it to
None): the write fails with AttributeError ("'NoneType' object has no attribute 'writelines'"). The cluster test that
SIGKILLs a queue's master met it once its streams' events went over that master too (a job's event channel lives in
its model's slot): each stream ends, and its cancel, sent while the master is down, died with a traceback.

`guard_pool` and `guard_cluster` give a client's connections a class that raises `redis.ConnectionError` instead.
"""
from __future__ import annotations

import functools
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster


def lost_transport(exc: BaseException) -> bool:
    """Whether `exc` is uvloop's (or asyncio's) way of saying the connection's socket is closed."""
    if isinstance(exc, AttributeError):
        return "'NoneType' object has no attribute 'write" in str(exc)
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)


class _LostTransport:
    """Mixed into a redis-py async connection class: a write to a closed transport fails as a lost connection."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except (RuntimeError, AttributeError) as exc:
            if not lost_transport(exc):
                raise
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise redis.ConnectionError(f"the connection to Redis was closed under a command ({exc})") from None


@functools.cache
def guarded(connection_class: type) -> type:
    """`connection_class` with `_LostTransport` mixed in (the same class for the same base: pools compare them)."""
    if issubclass(connection_class, _LostTransport):
        return connection_class
    return type(f"Guarded{connection_class.__name__}", (_LostTransport, connection_class), {})


def guard_pool(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """`pool`'s new connections guarded (a pool made by `from_url` or a Sentinel's: whatever class it chose)."""
    pool.connection_class = guarded(pool.connection_class)
    return pool


def guard_cluster(client: RedisCluster) -> RedisCluster:
    """Every node's new connections guarded, the nodes it knows now and those it learns later (redis-py makes each
    `ClusterNode` from the client's `connection_kwargs`, and offers no way to name the class)."""
    kwargs = client.connection_kwargs
    kwargs["connection_class"] = guarded(kwargs["connection_class"])
    for node in [*client.startup_nodes, *client.nodes_manager.startup_nodes.values(),
                 *client.nodes_manager.nodes_cache.values()]:
        node.connection_class = kwargs["connection_class"]
    return client
