"""A Redis connection of one's own for the hot paths: redis-py's `Connection`, without the pool checkout and the
pipeline machinery around every round trip.

Measured here (uvloop, Python 3.11): two commands through a pooled pipeline cost the caller about 205 µs of CPU
per round trip, on a connection of its own about 115 µs; eight commands under one timeout for the round trip
about 100 µs, with a timeout per reply (redis-py's `read_response`) about 180 µs. Commands are packed by hiredis
(C): redis-py's packer took 40 µs for 17 PUBLISH commands, hiredis 6. The worker makes one round trip per engine
step and three per job it takes; the API one per request.

`execute` takes a list of commands and answers their replies in order. Commands handed over while a round trip is
in flight go out together in the next one (one write, the replies read in order), so concurrent callers (the
API's requests enqueuing) share round trips. A command Redis refuses answers its ResponseError in its place: one
refused command never puts the replies of the others out of step. A lost connection is retried once on a fresh
one (a connection made stale by a Redis restart is not an error, as with `redis_client.connect`'s clients), then
fails the callers of that round trip with the error.

A lane that carries a blocking command (XREADGROUP with BLOCK) holds back everything queued behind it: give such
a caller a lane of its own.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from hiredis import pack_command
from redis.exceptions import NoScriptError, ResponseError

Command = Sequence[Any]
Waiting = tuple[bytes, int, "asyncio.Future[list[Any]]", float]  # packed commands, how many, replies, blocks_s
RETRIED = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)
_within = getattr(asyncio, "timeout", None)  # Python 3.11+


class Lane:
    def __init__(self, client: aioredis.Redis) -> None:
        # The pool's settings (URL, password or ACL user, TLS, db, timeouts), not one of its connections.
        self._connection = client.connection_pool.make_connection()
        # One bound for a whole round trip (connecting included) instead of a timeout context per reply read.
        self._timeout: float | None = self._connection.socket_timeout
        self._connection.socket_timeout = None
        self._waiting: list[Waiting] = []
        self._task: asyncio.Task[None] | None = None

    async def execute(self, commands: list[Command], blocks_s: float = 0.0) -> list[Any]:
        """Each command's reply, or the ResponseError Redis answered it with, in order. `blocks_s`: how long a
        blocking command among them may wait in Redis, beyond the socket timeout for its reply."""
        packed = self._pack(commands)  # a value Redis cannot take (None) is this caller's DataError, no one else's
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((packed, len(commands), future, blocks_s))
        if self._task is None:
            # A task of its own: a caller cancelled mid round trip must not leave the replies unread.
            self._task = asyncio.ensure_future(self._run())
        try:
            return await future
        except asyncio.CancelledError:
            if blocks_s and self._task is not None:
                # A blocked read nobody waits for must not take entries: dropping the connection unblocks it.
                self._task.cancel()
            raise

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for _, _, future, _ in self._waiting:
            future.cancel()
        self._waiting = []
        await self._connection.disconnect()

    async def _run(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                await self._round_trip(batch)
        finally:
            self._task = None
            if self._waiting:  # queued behind a round trip that was cancelled
                self._task = asyncio.ensure_future(self._run())

    async def _round_trip(self, batch: list[Waiting]) -> None:
        packed, count = b"".join(p for p, _, _, _ in batch), sum(n for _, n, _, _ in batch)
        timeout = self._timeout
        if timeout is not None:
            timeout += max(blocks_s for _, _, _, blocks_s in batch)
        try:
            try:
                replies = await self._send(packed, count, timeout)
            except RETRIED:
                replies = await self._send(packed, count, timeout)  # once more, on a fresh connection
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            for _, _, future, _ in batch:
                if not future.done():
                    future.cancel() if cancelled else future.set_exception(exc)
            if cancelled:
                raise
            return
        start = 0
        for _, n, future, _ in batch:
            if not future.done():
                future.set_result(replies[start:start + n])
            start += n

    async def _send(self, packed: bytes, count: int, timeout: float | None) -> list[Any]:
        try:
            if timeout is None:
                return await self._exchange(packed, count)
            if _within is not None:
                async with _within(timeout):
                    return await self._exchange(packed, count)
            return await asyncio.wait_for(self._exchange(packed, count), timeout)  # Python 3.10
        except asyncio.TimeoutError:
            await self._connection.disconnect()
            raise redis.TimeoutError(f"no reply from Redis within {timeout:.1f}s") from None
        except BaseException:
            await self._connection.disconnect()  # a half-read reply stream cannot be used again
            raise

    async def _exchange(self, packed: bytes, count: int) -> list[Any]:
        await self._connection.send_packed_command(packed, check_health=False)
        return [await self._read() for _ in range(count)]

    def _pack(self, commands: list[Command]) -> bytes:
        # hiredis packs in C, about 7 times faster than redis-py's Python packer (the worker packs a round trip
        # per engine step). It refuses what redis-py refuses too (None, bool): redis-py then raises its DataError.
        try:
            return b"".join([pack_command(tuple(command)) for command in commands])
        except TypeError:
            return b"".join(self._connection.pack_commands(commands))

    async def _read(self) -> Any:
        try:
            return await self._connection.read_response()
        except ResponseError as refused:
            return refused


class Script:
    """A Lua script run through a lane: EVALSHA, and EVAL when Redis does not have it (after a restart)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        return ["EVALSHA", self.sha, len(keys), *keys, *args]

    async def __call__(self, lane: Lane, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        [reply] = await lane.execute([self.command(keys, args)])
        if isinstance(reply, NoScriptError):
            [reply] = await lane.execute([["EVAL", self.source, len(keys), *keys, *args]])
        if isinstance(reply, ResponseError):
            raise reply
        return reply
