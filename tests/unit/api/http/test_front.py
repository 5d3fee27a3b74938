"""The front layer: generation POSTs skip FastAPI's layers but get the same guard and the same error answers."""
from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.testclient import TestClient

from api.http.front import Front, HotRequest, IndexedHeaders
from common.errors import OvqError

seen: list[str] = []


def make() -> TestClient:
    app = FastAPI()

    @app.exception_handler(OvqError)
    async def ovq_error(request: Request, exc: OvqError) -> JSONResponse:
        return JSONResponse({"error": exc.body.model_dump()}, status_code=exc.status)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": {"message": "internal error"}}, status_code=500)

    async def generate(request: Request) -> Response:
        seen.append(f"{request.app is app} {request.scope.get('guarded')}")
        body = await request.json()
        if body.get("bad"):
            raise OvqError("bad request", param="bad")
        if body.get("boom"):
            raise RuntimeError("boom")
        return JSONResponse({"ok": True})

    app.add_api_route("/v3/generate", generate, methods=["POST"])

    def guard(inner: Any) -> Any:
        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            scope["guarded"] = True
            await inner(scope, receive, send)
        return guarded

    return TestClient(Front(app, {"/v3/generate": generate}, guard), raise_server_exceptions=False)


def test_a_generation_post_goes_straight_to_its_handler_through_the_guard() -> None:
    seen.clear()
    assert make().post("/v3/generate", json={}).json() == {"ok": True}
    assert seen == ["True True"]


def test_its_errors_get_the_apps_handlers() -> None:
    client = make()
    bad = client.post("/v3/generate", json={"bad": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "bad"
    boom = client.post("/v3/generate", json={"boom": 1})
    assert boom.status_code == 500 and boom.json() == {"error": {"message": "internal error"}}


def test_other_methods_and_paths_go_through_fastapi() -> None:
    client = make()
    assert client.get("/v3/generate").status_code == 405
    assert client.post("/v3/other", json={}).status_code == 404


async def test_a_request_leaves_no_cycle_through_the_servers_send() -> None:
    """The front keeps uvicorn's `send` (a method of the connection's cycle, which holds the scope) in the scope
    while the request runs, and takes it out after: else every request's objects wait for a full GC."""
    cycles: list[weakref.ref[Any]] = []

    async def generate(request: Request) -> Response:
        cycles.append(weakref.ref(request.scope["ovq.send"].__self__))
        return JSONResponse({"ok": True})

    front = Front(FastAPI(), {"/v3/generate": generate}, lambda inner: inner)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(front, http="httptools", log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    gc.disable()
    try:
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"http://127.0.0.1:{sock.getsockname()[1]}/v3/generate", json={})
            assert answer.json() == {"ok": True}
        for _ in range(100):  # the server lets go of the connection once it sees it close
            if cycles[0]() is None:
                break
            await asyncio.sleep(0.01)
        assert cycles[0]() is None
    finally:
        gc.enable()
        server.should_exit = True
        await serving


def test_a_hot_requests_headers_answer_as_starlettes_do() -> None:
    """The indexed lookup answers hits, misses, any case and repeated names (the first wins) as starlette's scan."""
    raw = [(b"host", b"localhost"), (b"x-request-id", b"first"), (b"x-request-id", b"second"), (b"accept", b"")]
    hot, plain = HotRequest({"type": "http", "headers": list(raw)}).headers, Headers(raw=list(raw))
    assert isinstance(hot, IndexedHeaders)
    for name in ("host", "X-Request-Id", "x-REQUEST-id", "accept", "last-event-id"):
        assert hot.get(name) == plain.get(name) and (name in hot) == (name in plain)
        assert hot.get(name, "default") == plain.get(name, "default")
    assert hot["X-Request-Id"] == "first" and hot.getlist("x-request-id") == ["first", "second"]
    with pytest.raises(KeyError):
        hot["last-event-id"]
