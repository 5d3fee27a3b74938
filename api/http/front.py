"""The outermost ASGI layer: generation requests go straight to their handler, everything else through FastAPI.

A generation request is the API's hot path: profiled under load (py-spy, benchmarks/scale.py), FastAPI's own
layers cost more than the handler itself: an OpenTelemetry provider lookup, a body limit we already enforce, an
exit stack, a linear route match over every route, and dependency solving that parses the query string and
cookies the handler never reads. A POST to one of `hot` paths skips them: it gets the same key check and body
guard, and its exceptions the app's own handlers. The routes stay registered with FastAPI too (docs, 405s).

It also keeps the server's own `send` in the scope: SSE bodies (api/http/sse.py) write through it.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


class IndexedHeaders(Headers):
    """starlette's headers, looked up in a dict built on the first lookup. starlette scans every raw header per
    lookup, and a miss raises KeyError on the way: 2 µs each, and a generation request asks for about ten headers
    it mostly has not got (X-Request-Id, X-Request-Timeout, Last-Event-ID, the priority and resumable headers...).
    The first of repeated names wins, as in starlette."""

    _index: dict[str, str] | None = None

    def _lookup(self) -> dict[str, str]:
        if self._index is None:
            index: dict[str, str] = {}
            for key, value in self._list:
                index.setdefault(key.decode("latin-1"), value.decode("latin-1"))
            self._index = index
        return self._index

    def get(self, key: str, default: Any = None) -> Any:
        return self._lookup().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return self._lookup()[key.lower()]

    def __contains__(self, key: Any) -> bool:
        return key.lower() in self._lookup()


class HotRequest(Request):
    """The hot path's request: its headers are `IndexedHeaders`."""

    @property
    def headers(self) -> Headers:
        if not hasattr(self, "_headers"):
            self._headers = IndexedHeaders(scope=self.scope)
        return self._headers


class Front:
    def __init__(self, app: FastAPI, hot: Mapping[str, Endpoint], guard: Callable[[ASGIApp], ASGIApp]) -> None:
        self.app = app
        self.hot = dict(hot)
        self.direct = guard(self._direct)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope["ovq.send"] = send
        try:
            if scope["method"] == "POST" and scope["path"] in self.hot:
                scope["app"] = self.app
                return await self._outer(scope, receive, send)
            await self.app(scope, receive, send)
        finally:
            del scope["ovq.send"]  # the server's connection holds the scope: no cycle left for the GC to find

    async def _outer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """What the guard let through unhandled (not a client's disconnect: it handles that) is a logged 500."""
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.direct(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            response = await self.app.exception_handlers[Exception](Request(scope), exc)
            await response(scope, receive, send)

    async def _direct(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = HotRequest(scope, receive, send)
        try:
            try:
                response = await self.hot[scope["path"]](request)
            except Exception as exc:
                handler = self._handler(exc)
                if handler is None:
                    raise
                response = await handler(request, exc)
            await response(scope, receive, send)
        finally:
            await request.close()  # an image edit's uploaded files

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Awaitable[Response]] | None:
        """The app's handler for this exception, as its ExceptionMiddleware would pick it (Exception's is outer)."""
        handlers = self.app.exception_handlers
        for kind in type(exc).__mro__:
            if kind is Exception:
                return None
            if kind in handlers:
                return handlers[kind]
        return None

    def __getattr__(self, name: str) -> Any:  # the wrapped app's state, routes, ... stay reachable
        return getattr(self.app, name)
