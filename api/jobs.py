"""A job seen from the API: enqueue it, hold the HTTP status until its first event, follow it, cancel it."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from api.hub import EventHub
from api.priority import priority_of
from api.registry import Registry, Servable
from common.errors import OvqError, unavailable
from common.events import TERMINAL, Accepted, Error
from common.jobs import Job
from common.keys import Keys
from common.settings import Settings

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs and metrics do


class ClientGone(Exception):
    pass


Streamer = Callable[["Generation"], AsyncIterator[Any]]
Whole = Callable[["Generation", "asyncio.Future[None]"], Awaitable[Response]]


async def wait_disconnect(request: Request) -> None:
    """Returns when the client goes away (the request body must have been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class JobClient:
    def __init__(self, redis: aioredis.Redis, keys: Keys, hub: EventHub, registry: Registry, settings: Settings):
        self.redis, self.keys, self.hub, self.registry, self.settings = redis, keys, hub, registry, settings

    async def submit(self, job: Job, servable: Servable) -> Generation:
        queue = self.hub.register(job.id)  # before the job exists: its first event may come at once
        try:
            await self.registry.enqueue(servable, job)
        except BaseException:
            self.hub.unregister(job.id)
            raise
        return Generation(self, job, queue)

    async def respond(self, request: Request, job: Job, servable: Servable, stream: Streamer | None,
                      whole: Whole) -> Response:
        """Queue the job, hold the status until the worker's verdict, then answer as SSE or whole.

        The client leaving at any point (queued, running, mid-stream) cancels the job at its worker.
        """
        job.priority = priority_of(request)
        generation = await self.submit(job, servable)
        disconnect = asyncio.ensure_future(wait_disconnect(request))
        try:
            await generation.start(disconnect)
            if stream is not None:
                disconnect.cancel()  # the SSE response watches the connection from here on
                return EventSourceResponse(stream(generation), ping=15, sep="\n")
            return await whole(generation, disconnect)
        except ClientGone:
            await generation.close()
            return Response(status_code=CLIENT_CLOSED)
        except BaseException:
            await generation.close()
            raise
        finally:
            disconnect.cancel()

    async def cancel(self, job_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.cancel(job_id), 1, ex=self.settings.cancel_ttl_s)
        pipe.publish(self.keys.cancel_channel, job_id)
        await pipe.execute()


class Generation:
    """One submitted job: its events in order, exactly one terminal event, cancelled if left unfinished."""

    def __init__(self, client: JobClient, job: Job, queue: asyncio.Queue[Any]) -> None:
        self.client, self.job, self.queue = client, job, queue
        self.finished = False

    async def _next(self) -> Any:
        """The next event; while waiting, make sure a worker still serves the model."""
        check = self.client.settings.first_event_check_s
        while True:
            try:
                event = await asyncio.wait_for(self.queue.get(), timeout=check)
            except asyncio.TimeoutError:
                live = await self.client.registry.live_workers(self.job.model, [self.job.device])
                if not any(live.values()):
                    raise unavailable(f"No worker serves `{self.job.model}` on {self.job.device} any more") from None
                continue
            if event.type in TERMINAL:
                self.finished = True
            return event

    async def start(self, disconnect: asyncio.Future[None] | None = None) -> Accepted:
        """Wait for the worker's verdict: `accepted`, or its error as an exception (the HTTP status)."""
        while True:
            event = await self._race(self._next(), disconnect)
            if event.type == "accepted":
                return event
            if isinstance(event, Error):
                raise OvqError(event.error.message, event.status, event.error.type, event.error.param,
                               event.error.code)
            if event.type == "cancelled":
                raise ClientGone()

    async def events(self, disconnect: asyncio.Future[None] | None = None) -> AsyncIterator[Any]:
        """Events after `accepted`, up to and including the terminal one (repeated `accepted`s skipped)."""
        while not self.finished:
            event = await self._race(self._next(), disconnect)
            if event.type != "accepted":
                yield event

    async def _race(self, awaitable: Any, disconnect: asyncio.Future[None] | None) -> Any:
        if disconnect is None:
            return await awaitable
        task = asyncio.ensure_future(awaitable)
        await asyncio.wait([task, disconnect], return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            raise ClientGone()
        return task.result()

    async def close(self) -> None:
        """Forget the job; cancel it at its worker if it has not ended (the client left, or we failed)."""
        self.client.hub.unregister(self.job.id)
        if not self.finished:
            self.finished = True
            await asyncio.shield(self.client.cancel(self.job.id))
