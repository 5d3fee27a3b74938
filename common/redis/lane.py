"""A Redis connection of one's own for the hot paths, read by a protocol of its own.

redis-py connects it (TLS, AUTH or ACL user, SELECT: the client's settings), speaking RESP2; then the lane takes
the socket over (`take_over`). hiredis packs the commands and parses the replies as bytes arrive, and each caller
gets its replies from the socket's data callback once its last one is in: no reader task, no call per reply, no
timeout object per round trip, no pool checkout. Measured here (uvloop, Python 3.11, five commands a round trip,
one round trip a millisecond): about 95 µs of CPU per round trip on redis-py's `Connection` (a send, then
`read_response` per reply, under a timeout), about 50 µs on this protocol; most of what is left is the kernel's.
The worker makes one round trip per engine step and two or three per job it takes; the API one per request.

`execute` takes a list of commands and answers their replies in order. Commands handed over in the same
event-loop turn go out in one write; calls are pipelined, so a call is written at once even while others wait
for their replies. A command Redis refuses answers its ResponseError in its place: one refused command never puts
the replies of the others out of step, and neither does a caller that gives up (its replies are read and
dropped). A lost connection is retried once on a fresh one (a connection made stale by a Redis restart is not an
error, as with `redis_client.connect`'s clients). Every call has a bound: the client's socket timeout, else its
connect timeout, plus the block time of a blocking command; connecting has the same bound.

A blocking command (XREADGROUP with BLOCK) holds back, in Redis, everything sent behind it: give such a caller a
lane of its own. A caller that gives up a blocking command drops the connection, so the command takes nothing.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import hiredis
import redis
import redis.asyncio as aioredis
from hiredis import pack_command
from redis._parsers.base import BaseParser
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

Command = Sequence[Any]
RETRIED = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)
DEFAULT_TIMEOUT_S = 5.0
P = TypeVar("P", bound=asyncio.Protocol)


async def take_over(client: aioredis.Redis, protocol: Callable[[aioredis.Connection, asyncio.Transport], P]) -> P:
    """A RESP2 connection with `client`'s settings, connected by redis-py, whose socket `protocol` reads from then
    on. The protocol must keep the connection object: redis-py closes the socket when it is collected."""
    pool = client.connection_pool
    connection = pool.connection_class(**{**pool.connection_kwargs, "protocol": 2})
    try:
        await connection.connect()
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    transport = connection._writer.transport  # noqa: SLF001 - redis-py reads this socket no more
    reader = protocol(connection, transport)
    transport.set_protocol(reader)
    return reader


@dataclass(slots=True)
class Call:
    """One caller's commands in flight: how many replies they take, where the replies go, and by when."""

    count: int
    future: asyncio.Future[list[Any]]
    deadline: float
    replies: list[Any] = field(default_factory=list)


class Replies(asyncio.Protocol):
    """A lane's socket: the replies of every call in flight, handed to each caller in order as they arrive.

    Calls are pipelined: a call is written at once, even while others wait for their replies. One timer watches
    the oldest call's deadline (re-armed only when it fires), instead of a timeout per round trip."""

    def __init__(self, connection: aioredis.Connection, transport: asyncio.Transport) -> None:
        self._connection, self._transport = connection, transport  # the connection kept: see `take_over`
        self._reader = hiredis.Reader()
        self._calls: deque[Call] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.lost = False

    def send(self, packed: bytes, calls: list[Call]) -> None:
        for call in calls:
            if self._calls:  # behind a blocking call it waits for that one in Redis: its deadline is never sooner
                call.deadline = max(call.deadline, self._calls[-1].deadline)
            self._calls.append(call)
        self._transport.write(packed)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(self._calls[0].deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if not self._calls:
            return
        oldest = self._calls[0]
        loop = asyncio.get_running_loop()
        if loop.time() >= oldest.deadline:
            self.abort(redis.TimeoutError("no reply from Redis in time"))
        else:
            self._timer = loop.call_at(oldest.deadline, self._expire)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        calls, gets = self._calls, self._reader.gets
        try:
            while calls:
                call = calls[0]
                replies = call.replies
                while len(replies) < call.count:
                    reply = gets()
                    if reply is False:
                        return
                    if isinstance(reply, hiredis.ReplyError):
                        reply = BaseParser.parse_error(str(reply))
                        if isinstance(reply, ReadOnlyError):  # a primary demoted by a failover: find the new one
                            self.abort(redis.ConnectionError("the primary became a replica"))
                            return
                    replies.append(reply)
                calls.popleft()
                if not call.future.done():  # its caller may have given up
                    call.future.set_result(replies)
            if gets() is not False:
                self.abort(redis.ConnectionError("Redis sent a reply nobody asked for"))
        except hiredis.ProtocolError as exc:
            self.abort(redis.ConnectionError(f"unreadable reply from Redis: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.abort(redis.ConnectionError(f"Redis closed the connection{f' ({exc})' if exc else ''}"))

    def abort(self, why: Exception) -> None:
        """Drop the connection; every call in flight fails with `why`."""
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        calls, self._calls = self._calls, deque()
        for call in calls:
            if not call.future.done():
                call.future.set_exception(why)
        self._transport.abort()


class Lane:
    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        settings = client.connection_pool.connection_kwargs
        self._timeout: float = (settings.get("socket_timeout") or settings.get("socket_connect_timeout")
                                or DEFAULT_TIMEOUT_S)
        self._replies: Replies | None = None
        self._pending: list[tuple[bytes, Call]] = []  # handed over in this event-loop turn, or while connecting
        self._flushing = False
        self._connecting: asyncio.Task[None] | None = None

    async def execute(self, commands: list[Command], blocks_s: float = 0.0, retry: bool = True) -> list[Any]:
        """Each command's reply, or the ResponseError Redis answered it with, in order. `blocks_s`: how long a
        blocking command among them may wait in Redis, beyond the socket timeout for its reply. `retry`: False for a
        caller that must check something first when a connection was lost (the worker's publisher: its fence)."""
        if not commands:
            return []
        packed = self._pack(commands)  # a value Redis cannot take (None) is this caller's DataError, no one else's
        try:
            try:
                return await self._call(packed, len(commands), blocks_s)
            except RETRIED:
                if not retry:
                    raise
                return await self._call(packed, len(commands), blocks_s)  # once more, on a fresh connection
        except asyncio.CancelledError:
            if blocks_s:  # a blocked read nobody waits for must not take entries: dropping the connection ends it
                self._drop()
            raise

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        pending, self._pending = self._pending, []
        for _, call in pending:
            call.future.cancel()
        self._drop()

    def _call(self, packed: bytes, count: int, blocks_s: float) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        call = Call(count, loop.create_future(), loop.time() + self._timeout + blocks_s)
        self._pending.append((packed, call))
        if not self._flushing:
            self._flushing = True
            loop.call_soon(self._flush)
        return call.future

    def _flush(self) -> None:
        """What this event-loop turn handed over, in one write."""
        self._flushing = False
        replies = self._replies
        if replies is None or replies.lost:
            if self._connecting is None and self._pending:
                self._connecting = asyncio.ensure_future(self._connect())
            return
        pending, self._pending = [(p, c) for p, c in self._pending if not c.future.done()], []
        if pending:
            self._write(replies, pending)

    def _write(self, replies: Replies, pending: list[tuple[bytes, Call]]) -> None:
        replies.send(b"".join(packed for packed, _ in pending), [call for _, call in pending])

    async def _connect(self) -> None:
        try:
            self._replies = await asyncio.wait_for(take_over(self._client, Replies), self._timeout)
        except Exception as exc:
            failed = redis.TimeoutError(f"no connection to Redis within {self._timeout:.1f}s") \
                if isinstance(exc, asyncio.TimeoutError) else exc
            pending, self._pending = self._pending, []
            for _, call in pending:
                if not call.future.done():
                    call.future.set_exception(failed)
            return
        finally:
            self._connecting = None
        self._flush()

    def _drop(self) -> None:
        if self._replies is not None:
            self._replies.abort(redis.ConnectionError("the lane dropped its connection"))
            self._replies = None

    def _pack(self, commands: list[Command]) -> bytes:
        # hiredis packs in C, about 7 times faster than redis-py's Python packer (the worker packs a round trip
        # per engine step). It refuses what redis-py refuses too (None, bool): redis-py then raises its DataError.
        try:
            return b"".join([pack_command(tuple(command)) for command in commands])
        except TypeError:
            return b"".join(self._client.connection_pool.make_connection().pack_commands(commands))


class Script:
    """A Lua script run through a lane: EVALSHA, and EVAL when Redis does not have it (after a restart)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        return ["EVALSHA", self.sha, len(keys), *keys, *args]

    async def __call__(self, lane: Lane, keys: Sequence[Any], args: Sequence[Any],
                       before: Sequence[Command] = ()) -> Any:
        """`before`: commands that run just ahead of the script, in the same round trip (one Redis refused raises,
        after the script ran)."""
        *first, reply = await lane.execute([*before, self.command(keys, args)])
        refused(first)
        if isinstance(reply, NoScriptError):
            [reply] = await lane.execute([["EVAL", self.source, len(keys), *keys, *args]])
        if isinstance(reply, ResponseError):
            raise reply
        return reply


def refused(replies: Sequence[Any]) -> None:
    """Raises the first ResponseError among `replies`."""
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
