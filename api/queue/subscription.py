"""The API process's subscription to its reply channel, read by a protocol of its own.

redis-py connects (TLS, AUTH or ACL user, SELECT, as configured); then `Subscription` takes over the socket
(`common.redis.lane.take_over`). Each reply is parsed by hiredis as bytes arrive, and each message is handed to
`on_message` from the socket's data callback itself. redis-py's `PubSub` took a task wake-up and five layers of
calls per message (`get_message`, `parse_response`, `_execute`, `read_response`, `handle_message`), and a
message comes with every engine step of every worker. Measured here with one 1.8 KB message a millisecond: about
80 µs of CPU per message through `PubSub` (90 with RESP3, whose push messages redis-py formats for a debug log
line), about 40 µs through this protocol.

The connection speaks RESP2: a message is a plain array, `[b"message", channel, data]`. On a Redis Cluster the
channel is sharded: SSUBSCRIBE on the master that owns its slot, messages `[b"smessage", channel, data]`; Redis
ends the subscription (`sunsubscribe`) when the slot moves, and the hub subscribes again where it is now.

A subscription that hears nothing for `ping_s` sends PING (answered even while subscribed); one that then hears
nothing for `timeout_s` more is dropped, so a Redis gone silent (a partition, a host that vanished) is noticed.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from common.redis.cluster import node_client
from common.redis.lane import take_over

log = logging.getLogger("ovq.api.hub")
PING = hiredis.pack_command(("PING",))


class Subscription(asyncio.Protocol):
    def __init__(self, connection: aioredis.Connection, transport: asyncio.Transport,
                 on_message: Callable[[bytes], None]) -> None:
        loop = asyncio.get_running_loop()
        # Kept: redis-py closes its socket when the connection object is collected.
        self._connection, self._transport, self._on_message = connection, transport, on_message
        self._reader = hiredis.Reader()
        self.subscribed: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[BaseException] = loop.create_future()  # why it ended
        self.heard = time.monotonic()
        self._pinged = False

    def data_received(self, data: bytes) -> None:
        self.heard, self._pinged = time.monotonic(), False
        self._reader.feed(data)
        try:
            while (reply := self._reader.gets()) is not False:
                self._reply(reply)
        except hiredis.ProtocolError as exc:
            self.close(redis.ConnectionError(f"unreadable reply from Redis: {exc}"))

    def _reply(self, reply: Any) -> None:
        if isinstance(reply, hiredis.ReplyError):  # SUBSCRIBE refused (an ACL without the channel)
            self.close(redis.ResponseError(str(reply)))
        elif reply[0] == b"message" or reply[0] == b"smessage":  # smessage: sharded pub/sub (a Cluster)
            try:
                self._on_message(reply[2])
            except Exception:  # one bad message must not end the subscription (and with it every stream)
                log.exception("an event message could not be dispatched")
        elif reply[0] in (b"subscribe", b"ssubscribe") and not self.subscribed.done():
            self.subscribed.set_result(None)
        elif reply[0] == b"sunsubscribe":  # the channel's slot moved to another master: subscribe there
            self.close(redis.ConnectionError("the channel's slot moved to another Redis Cluster node"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(exc or redis.ConnectionError("Redis closed the connection"))

    def check(self, ping_s: float, timeout_s: float) -> None:
        """From a ticker: PING when quiet for `ping_s`, give up when that PING goes unanswered for `timeout_s`."""
        if self.closed.done():
            return
        quiet = time.monotonic() - self.heard
        if quiet >= ping_s + timeout_s and self._pinged:
            self.close(redis.TimeoutError(f"no reply from Redis to a PING within {timeout_s:.0f}s"))
        elif quiet >= ping_s and not self._pinged:
            self._pinged = True
            self._transport.write(PING)

    def send(self, packed: bytes) -> None:
        self._transport.write(packed)

    def close(self, why: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(why)
        if not self.subscribed.done():
            failed = why if isinstance(why, Exception) else redis.ConnectionError("the subscription was closed")
            self.subscribed.set_exception(failed)
            self.subscribed.exception()  # retrieved: `closed` says why
        self._transport.abort()


async def subscribe(client: aioredis.Redis, channel: str, on_message: Callable[[bytes], None],
                    timeout_s: float) -> Subscription:
    """A connection with `client`'s settings, subscribed to `channel` within `timeout_s`; raises what Redis or the
    network did (a redis-py error, an OSError)."""
    try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel (common/tasks.py)
        async with asyncio.timeout(timeout_s):
            return await _subscribe(client, channel, on_message)
    except TimeoutError:
        raise redis.TimeoutError(f"no answer to SUBSCRIBE within {timeout_s:.0f}s") from None


async def _subscribe(client: aioredis.Redis, channel: str, on_message: Callable[[bytes], None]) -> Subscription:
    command = "SUBSCRIBE"
    if isinstance(client, RedisCluster):  # sharded pub/sub, on the master of the channel's slot (slot map learnt anew)
        client, command = await node_client(client, channel, refresh=True), "SSUBSCRIBE"
    subscription = await take_over(client, lambda connection, transport: Subscription(connection, transport,
                                                                                      on_message))
    subscription.send(hiredis.pack_command((command, channel)))
    try:
        await subscription.subscribed
    except BaseException as exc:
        subscription.close(exc)
        raise
    return subscription
