"""A write to a connection whose socket uvloop closed fails as a lost connection, on every client ovq makes."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
import uvloop

from common.redis.client import NO_CLIENT_INFO, connect
from common.redis.cluster import connect_cluster
from common.redis.transport import guarded
from common.settings import Settings


def _raised(connection_class: type, spoil: Callable[[Any], None], run: Callable[[Any], Any]) -> type[BaseException]:
    """What `send_packed_command` raises on a connected connection that `spoil` damaged, under the loop of `run`."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):  # whatever the connection's handshake sends: one command a read, here
            writer.write(b"+OK\r\n")

    async def main() -> type[BaseException]:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        connection = connection_class(host="127.0.0.1", port=server.sockets[0].getsockname()[1], **NO_CLIENT_INFO)
        await connection.connect()
        spoil(connection)
        try:
            await connection.send_packed_command(b"PING\r\n", check_health=False)
        except BaseException as exc:  # noqa: BLE001 - the type is the answer
            return type(exc)
        finally:
            server.close()
        return type(None)  # type: ignore[return-value]

    return run(main())


def _close_transport(connection: Any) -> None:
    connection._writer.transport.close()  # what redis-py's cluster pipeline does to a shared client's sockets


def _drop_writer_before_the_write(connection: Any) -> None:
    """Another task's `disconnect` between the connected check and the write (redis-py's cluster pipeline during a
    failover): the writer is None, the connection still in use."""
    write = connection._send_packed_command

    async def raced(command: object) -> None:
        connection._writer = None
        await write(command)

    connection._send_packed_command = raced


def test_a_write_to_a_transport_uvloop_closed_is_a_lost_connection() -> None:
    """redis-py's own class lets uvloop's RuntimeError through (the API's streams died of it during a Cluster
    failover); the guarded class raises ConnectionError, which redis-py retries and ovq treats as Redis away."""
    assert _raised(aioredis.Connection, _close_transport, uvloop.run) is RuntimeError
    assert _raised(guarded(aioredis.Connection), _close_transport, uvloop.run) is redis.ConnectionError


def test_a_write_on_a_connection_whose_writer_was_dropped_is_a_lost_connection() -> None:
    """A Cluster master SIGKILLed: a stream's cancel met this race on asyncio's loop and ended the response with a
    traceback."""
    assert _raised(aioredis.Connection, _drop_writer_before_the_write, asyncio.run) is AttributeError
    assert _raised(guarded(aioredis.Connection), _drop_writer_before_the_write, asyncio.run) is redis.ConnectionError


def test_guarded_is_one_class_per_base() -> None:
    assert guarded(aioredis.Connection) is guarded(aioredis.Connection)
    assert guarded(guarded(aioredis.Connection)) is guarded(aioredis.Connection)


async def test_every_client_ovq_makes_guards_its_connections() -> None:
    """A plain URL's pool, TLS and a unix socket included, and every node of a Cluster client, now and learnt later."""
    for url in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///tmp/none.sock"):
        client = connect(Settings(redis_url=url))
        assert client.connection_pool.connection_class.__name__.startswith("Guarded"), url
        await client.aclose()
    cluster = connect_cluster("redis+cluster://127.0.0.1:1,127.0.0.1:2", 4, 1.0)
    nodes = [*cluster.startup_nodes, *cluster.nodes_manager.startup_nodes.values()]
    assert nodes and all(node.connection_class is guarded(aioredis.Connection) for node in nodes)
    assert cluster.nodes_manager.connection_kwargs["connection_class"] is guarded(aioredis.Connection)
    await cluster.aclose()
