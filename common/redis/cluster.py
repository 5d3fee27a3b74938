"""Redis Cluster: the URL, the client, and the hot paths' lanes routed to the master that owns each key's slot.

`REDIS_URL=redis+cluster://[[user]:password@]host:port[,host:port...][?options]` (`rediss+cluster://` for TLS):
the seed nodes; the rest of the cluster is learnt from them (CLUSTER SLOTS), and learnt again after a MOVED or a
lost connection (a failover). Ordinary commands go through redis-py's `RedisCluster`, which routes each one. The hot
paths' pipelined connections (`common.redis.lane.Lane`) have a `ClusterLane` instead: one Lane per master, each
command sent to the master of its key's slot (`common.keys.Keys(cluster=True)` tags keys so that what one script or
round trip needs together shares a slot). Events and cancels go over sharded pub/sub (SPUBLISH/SSUBSCRIBE on the
channel's master: `node_client`). A single Redis never reaches this module: the branch is taken once, at connect.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlparse

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from common.redis.hosts import host_list
from common.redis.lane import RETRIED, Command, Lane
from common.redis.transport import guard_cluster

log = logging.getLogger("ovq.redis")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
REROUTED = (MovedError, AskError, TryAgainError, ClusterDownError)  # the command did not run: send it again
# What a Cluster answers while a master is down and before its replica is promoted, or while a slot migrates
# (redis-py's ClusterError: "TTL exhausted", its redirections and TRYAGAIN waits spent).
FAILING_OVER = (ClusterDownError, TryAgainError, SlotNotCoveredError, ClusterError)
ATTEMPTS = 3  # sends of one command across MOVED replies and failovers
# Waits, before sending again, for a command refused TRYAGAIN (its keys split by a slot migration): 3.1 s in all.
MIGRATING_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


class ClusterURLError(ValueError):
    pass


@dataclass(frozen=True)
class ClusterURL:
    """`redis+cluster://[[user]:password@]host:port[,host:port...][?socket_timeout=...]`: the seed nodes."""

    nodes: list[tuple[str, int]]
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str) -> ClusterURL:
        parsed = urlparse(url)
        userinfo, _, hosts = parsed.netloc.rpartition("@")
        username, _, password = userinfo.partition(":")
        try:
            nodes = host_list(hosts, 6379)
        except ValueError:
            raise ClusterURLError(f"REDIS_URL {url!r} is malformed: want redis+cluster://host:port[,host:port...]") \
                from None
        if not nodes or parsed.path.strip("/"):
            raise ClusterURLError(f"REDIS_URL {url!r} is malformed: want redis+cluster://host:port[,host:port...] "
                                  "(a Cluster has no databases to choose)")
        ssl = parsed.scheme.startswith("rediss")
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        try:
            options = redis.connection.parse_url(f"{'rediss' if ssl else 'redis'}://localhost/0?{urlencode(query)}")
        except ValueError as exc:
            raise ClusterURLError(f"REDIS_URL {url!r} is malformed: {exc}") from None
        options = {k: v for k, v in options.items() if k not in ("host", "port", "db", "connection_class")}
        return cls(nodes, unquote(username) or None, unquote(password) or None, ssl, options)

    def node_kwargs(self) -> dict[str, Any]:
        return {"username": self.username, "password": self.password, **self.options,
                **({"ssl": True} if self.ssl else {})}


def is_cluster(url: str) -> bool:
    return urlparse(url).scheme in CLUSTER_SCHEMES


def connect_cluster(url: str, max_connections: int, timeout_s: float, **options: Any) -> RedisCluster:
    """A `RedisCluster` client over the URL's seed nodes (`max_connections` per node)."""
    target = ClusterURL.parse(url)
    return guard_cluster(RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
                                      max_connections=max_connections, socket_connect_timeout=timeout_s,
                                      **{"socket_timeout": timeout_s, **options, **target.node_kwargs()}))


def sync_cluster(url: str, **options: Any) -> redis.RedisCluster:
    target = ClusterURL.parse(url)
    return redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in target.nodes],
                              **{**options, **target.node_kwargs()})


def describe_cluster(url: str) -> str:
    return "cluster via " + ",".join(f"{host}:{port}" for host, port in ClusterURL.parse(url).nodes)


def key_of(command: Command) -> Any:
    """The key that routes `command` (its first: a round trip's keys share a slot by design), or None."""
    name = command[0]
    if name in ("EVALSHA", "EVAL"):
        return command[3] if int(command[2]) else None
    if name in ("XREADGROUP", "XREAD"):
        for i, part in enumerate(command):
            if part == "STREAMS":
                return command[i + 1]
    if name == "PUBSUB":
        return command[2] if len(command) > 2 else None
    if name in ("PING", "TIME", "WAIT", "INFO", "ASKING"):
        return None
    return command[1] if len(command) > 1 else None


def slot_of(key: Any) -> int:
    return key_slot(key if isinstance(key, bytes) else str(key).encode())


async def initialized(cluster: RedisCluster) -> RedisCluster:
    """The client with its slot map learnt (the first command does it too; lanes need it before that)."""
    if cluster._initialize:  # noqa: SLF001 - redis-py's own flag: no slot map yet
        with unreachable():
            await cluster.initialize()
    return cluster


@contextmanager
def unreachable() -> Iterator[None]:
    """redis-py's "no node answers" (RedisClusterException) as what the tiers wait out: a ConnectionError."""
    try:
        yield
    except RedisClusterException as exc:
        raise redis.ConnectionError(f"the Redis Cluster's slot map could not be read: {exc}") from exc


async def node_client(cluster: RedisCluster, key: str, refresh: bool = False) -> aioredis.Redis:
    """A plain client on the master that owns `key`'s slot (for a connection of one's own there: a lane, a sharded
    subscription); `refresh`: learn the slot map again first (after a failover)."""
    await initialized(cluster)
    with unreachable():
        if refresh:
            await cluster.nodes_manager.initialize()
        node = cluster.nodes_manager.get_node_from_slot(slot_of(key))
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=node.connection_class,
                                                                  **node.connection_kwargs))


class ClusterLane:
    """`Lane`'s interface over a Cluster: each command goes to the lane of the master that owns its key's slot (a
    call whose commands live on several masters is sent to each at once and answered in order). A command answered
    ASK goes to the migrating slot's target behind ASKING. One answered MOVED, TRYAGAIN or CLUSTERDOWN did not run:
    the slot map is learnt again and it is sent again, as is a call whose connection was lost (its master failed
    over), up to ATTEMPTS times."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._lanes: dict[str, Lane] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._timeout: float = cluster.connection_kwargs.get("socket_timeout") or 5.0

    async def execute(self, commands: list[Command], blocks_s: float = 0.0, retry: bool = True) -> list[Any]:
        """`retry`: as `Lane.execute`'s (False: a lost connection is not sent again, on any master)."""
        if not any(command[0] == "PUBSUB" for command in commands):
            return await self._execute(commands, blocks_s, retry)
        # A channel's subscribers are counted on its slot's master (sharded pub/sub): PUBSUB NUMSUB a b ... is
        # asked as PUBSUB SHARDNUMSUB of each channel on its own node, answered as one flat reply.
        expanded: list[Command] = []
        spans: list[tuple[int, int, bool]] = []
        for command in commands:
            numsub = command[0] == "PUBSUB" and command[1] == "NUMSUB"
            parts = [["PUBSUB", "SHARDNUMSUB", channel] for channel in command[2:]] if numsub else [command]
            spans.append((len(expanded), len(expanded) + len(parts), numsub))
            expanded += parts
        replies = await self._execute(expanded, blocks_s, retry)
        answered: list[Any] = []
        for start, end, numsub in spans:
            if not numsub:
                answered.append(replies[start])
                continue
            failed = next((r for r in replies[start:end] if isinstance(r, Exception)), None)
            answered.append(failed if failed is not None else [part for r in replies[start:end] for part in r])
        return answered

    async def _execute(self, commands: list[Command], blocks_s: float, retry: bool = True) -> list[Any]:
        if not commands:
            return []
        await initialized(self._cluster)
        replies: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        attempt = waits = 0
        while True:
            final = attempt == ATTEMPTS - 1
            groups: dict[str, list[int]] = {}
            node = None
            with unreachable():
                for i in todo:  # a command without a key (WAIT, INFO) goes where the one before it went
                    node = self._node(commands[i], node)
                    groups.setdefault(node, []).append(i)
            results = await asyncio.gather(*(self._lane(node).execute([commands[i] for i in group], blocks_s, retry)
                                             for node, group in groups.items()), return_exceptions=True)
            todo, asked = [], []
            lost: BaseException | None = None
            for group, result in zip(groups.values(), results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, RETRIED) or final or not retry:
                        raise result
                    lost = result
                    todo += group
                    continue
                for i, reply in zip(group, result, strict=True):
                    if isinstance(reply, AskError) and not isinstance(reply, MovedError):
                        asked.append(i)
                    elif isinstance(reply, REROUTED) and not final:
                        todo.append(i)
                    replies[i] = reply
            for i in asked:  # its slot is migrating and the key is on the target already: ask there, this once
                replies[i] = await self._ask(commands[i], replies[i], blocks_s)
                if isinstance(replies[i], TryAgainError) and not final:
                    todo.append(i)
            if not todo:
                return replies
            if waits < len(MIGRATING_PAUSES_S) and all(isinstance(replies[i], TryAgainError) for i in todo):
                # A slot migrating (resharding) with the command's keys split between its two masters for now: the
                # slot map is right, so no refresh; wait for the keys to move, a bounded number of times.
                await asyncio.sleep(MIGRATING_PAUSES_S[waits])
                waits += 1
            else:
                attempt += 1
                await self._refresh(lost)
            todo.sort()

    async def _ask(self, command: Command, ask: AskError, blocks_s: float) -> Any:
        """`command` on the node an ASK named, behind ASKING (which lets only the next command in): both in one
        call, so adjacent on that node's connection."""
        target = self._cluster.get_node(host=ask.host, port=ask.port)
        if target is None:
            return ask
        _, reply = await self._lane(target.name).execute([["ASKING"], command], blocks_s)
        return reply

    async def close(self) -> None:
        lanes, self._lanes = self._lanes, {}
        for lane in lanes.values():
            await lane.close()

    def _node(self, command: Command, before: str | None) -> str:
        key = key_of(command)
        if key is None:
            return before or self._cluster.get_default_node().name
        return self._cluster.nodes_manager.get_node_from_slot(slot_of(key)).name

    def _lane(self, name: str) -> Lane:
        lane = self._lanes.get(name)
        if lane is None:
            node = self._cluster.get_node(node_name=name)
            client = aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=node.connection_class,
                                                                            **node.connection_kwargs))
            lane = self._lanes[name] = Lane(client)
        return lane

    async def _refresh(self, lost: BaseException | None) -> None:
        """Learn the slot map again (one refresh at a time; callers meanwhile wait for it). After a lost connection,
        first a short pause: a failover takes the cluster's node timeout, and asking at once learns the dead master."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._learn(0.2 if lost is not None else 0.0))
            self._refreshing.add_done_callback(lambda _: setattr(self, "_refreshing", None))
        await asyncio.shield(self._refreshing)

    async def _learn(self, pause_s: float) -> None:
        await asyncio.sleep(pause_s)
        try:
            await asyncio.wait_for(self._cluster.nodes_manager.initialize(), self._timeout)
        except (asyncio.TimeoutError, *RETRIED, redis.RedisError, RedisClusterException) as exc:
            log.warning("the Redis Cluster's slot map could not be read again: %s", exc)


def open_lane(client: Any) -> Lane | ClusterLane:
    """A lane on `client`'s Redis: a `ClusterLane` on a Cluster, else a plain `Lane`."""
    return ClusterLane(client) if isinstance(client, RedisCluster) else Lane(client)


class SlotMaster:
    """A connection to whichever master owns one slot when it connects: a plain client for rq (the Batch API), whose
    keys all share one slot (`Keys.rq_prefix`) but which speaks to one Redis (MULTI, WATCH). After a failover the
    next connection reaches the promoted replica, as a Sentinel-managed connection reaches the new primary."""

    def __init__(self, *, locate: Callable[[bool], tuple[str, int]], **kwargs: Any) -> None:
        self._locate, self._stale = locate, False
        super().__init__(**kwargs)  # type: ignore[call-arg]

    def _connect(self) -> Any:
        self.host, self.port = self._locate(self._stale)
        self._stale = False
        try:
            return super()._connect()  # type: ignore[misc]
        except OSError:
            self._locate(True)  # the master may have failed over: ask the cluster again for the next try
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """A node that says the slot is not its own now, or that the cluster is down (a master failing over), is
        a lost connection: the command did not run, and the next connection asks where the slot is. rq retries
        a lost connection with backoff; any other error ended the batch worker with a traceback at each failover."""
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except REROUTED as exc:
            self._stale = True
            self.disconnect()  # type: ignore[attr-defined]
            raise redis.ConnectionError(f"the Redis Cluster is moving the Batch API's slot ({exc})") from None


class SlotMasterConnection(SlotMaster, redis.Connection):
    pass


class SlotMasterSSLConnection(SlotMaster, redis.SSLConnection):
    pass


def sync_slot_client(url: str, key: str, **options: Any) -> redis.Redis:
    """A blocking client on the master that owns `key`'s slot now (`SlotMaster`)."""
    target = ClusterURL.parse(url)
    clusters: list[redis.RedisCluster] = []  # made at the first connect: it reads the slot map
    lock = threading.Lock()

    def locate(refresh: bool) -> tuple[str, int]:
        with lock:
            try:
                if not clusters:
                    clusters.append(sync_cluster(url, **options))
                elif refresh:
                    clusters[0].nodes_manager.initialize()
                node = clusters[0].get_node_from_key(key)
            except (redis.RedisError, RedisClusterException) as exc:
                raise redis.ConnectionError(f"the Redis Cluster's slot map could not be read: {exc}") from exc
            return node.host, int(node.port)

    kwargs = {k: v for k, v in {**options, **target.node_kwargs()}.items() if k != "ssl"}
    connection = SlotMasterSSLConnection if target.ssl else SlotMasterConnection
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=connection, locate=locate, **kwargs))
