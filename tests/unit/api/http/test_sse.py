"""SSE responses: frames from the response's loop and frames the hub writes directly keep their order."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import uvicorn

from api.http.sse import DirectWrite, Last, SSEResponse
from api.queue.hub import Inbox


def cycle(**overrides: Any) -> SimpleNamespace:
    written: list[bytes] = []
    values = {"transport": SimpleNamespace(write=written.append), "flow": SimpleNamespace(write_paused=False),
              "disconnected": False, "response_complete": False, "chunked_encoding": True, "written": written}
    values.update(overrides)
    return SimpleNamespace(**values)


def test_direct_write_frames_a_chunk() -> None:
    c = cycle()
    write = DirectWrite(c)
    assert write(b"data: x\n\n")
    assert write(b"")  # nothing to write: an empty chunk would end the body
    assert c.written == [b"9\r\ndata: x\n\n\r\n"]


def test_direct_write_declines_when_the_server_would_wait_or_cannot_write() -> None:
    for blocked in ({"flow": SimpleNamespace(write_paused=True)}, {"disconnected": True},
                    {"response_complete": True}, {"chunked_encoding": False}):
        c = cycle(**blocked)
        assert not DirectWrite(c)(b"data: x\n\n"), blocked
        assert c.written == []
    c = cycle()
    write = DirectWrite(c)
    write.busy = True  # the response's loop has frames in flight: they go first
    assert not write(b"data: x\n\n")


def test_direct_write_needs_the_httptools_cycle() -> None:
    async def plain_send(message: Any) -> None:
        pass

    assert DirectWrite.of({"ovq.send": plain_send}) is None
    assert DirectWrite.of({}) is None


def test_express_only_when_nothing_is_queued() -> None:
    inbox, handled = Inbox(), []

    def express(event: dict[str, Any]) -> bool:
        if event["type"] != "delta":
            return False
        handled.append(event["n"])
        return True

    inbox.express = express
    inbox.push({"type": "delta", "n": 1})
    inbox.push({"type": "done", "n": 2})  # declined: queued for the task
    inbox.push({"type": "delta", "n": 3})  # behind a queued event: queued too, never ahead of it
    assert handled == [1]
    assert [e["n"] for e in inbox.events] == [2, 3]


async def closed() -> None:
    pass


class Recorder:
    """A connection's transport that keeps what each write wrote."""

    def __init__(self, transport: Any) -> None:
        self.transport, self.writes = transport, []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@asynccontextmanager
async def served(frames: Callable[[], AsyncIterator[bytes]], **options: Any) -> AsyncIterator[tuple[int, list]]:
    """An SSEResponse of `frames` on uvicorn's httptools server: its port, and each connection's `Recorder`."""
    recorders: list[Recorder] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        scope["ovq.send"] = send  # as api/http/front.py keeps it
        cycle = send.__self__
        cycle.transport = Recorder(cycle.transport)
        recorders.append(cycle.transport)
        await SSEResponse(frames(), closed, **options)(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http="httptools", log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield sock.getsockname()[1], recorders
    finally:
        server.should_exit = True
        await serving


async def test_direct_writes_interleave_in_order_on_uvicorn() -> None:
    """On the real server, a direct write between two frames of the loop lands between them on the wire."""
    writers: list[DirectWrite] = []
    between = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await between.wait()
        yield b"data: 3\n\n"

    async with served(frames, on_write=writers.append) as (port, _):
        async with httpx.AsyncClient() as client:
            async with client.stream("GET", f"http://127.0.0.1:{port}/") as response:
                chunks = response.aiter_bytes()
                body = await anext(chunks)
                assert writers, "uvicorn's httptools cycle changed: the direct write is gone"
                assert writers[0](b"data: 2\n\n")
                between.set()
                async for chunk in chunks:
                    body += chunk
        assert body == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"


async def test_the_head_goes_out_with_a_first_frame_ready_at_once() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        yield Last(b"data: [DONE]\n\n")

    async with served(frames) as (port, recorders):
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
    assert response.text == "data: 1\n\ndata: [DONE]\n\n"
    first, *rest = recorders[0].writes
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    assert len(rest) == 1  # the last frame and the end of the body


async def test_the_head_does_not_wait_for_a_first_frame_that_takes_time() -> None:
    """A stream whose first frame waits (a completion's first token) still has its head out at once."""
    later = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        await later.wait()
        yield Last(b"data: [DONE]\n\n")

    async with served(frames) as (port, recorders):
        async with httpx.AsyncClient() as client:
            async with client.stream("GET", f"http://127.0.0.1:{port}/") as response:
                assert response.status_code == 200  # the head came while the frame still waits
                assert recorders[0].writes[0].startswith(b"HTTP/1.1 200")
                assert recorders[0].writes[0].endswith(b"\r\n\r\n")
                later.set()
                assert await response.aread() == b"data: [DONE]\n\n"


async def test_the_last_frames_go_out_with_the_end_of_the_body() -> None:
    sent: list[dict[str, Any]] = []
    cleaned: list[bool] = []

    async def frames() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            yield Last(b"data: 2\n\ndata: [DONE]\n\n")
        finally:
            cleaned.append(True)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await SSEResponse(frames(), closed)({"type": "http", "method": "POST"}, None, send)  # type: ignore[arg-type]
    assert [(m.get("body"), m.get("more_body")) for m in sent[1:]] == [
        (b"data: 1\n\n", True), (b"data: 2\n\ndata: [DONE]\n\n", False)]
    assert cleaned == [True]  # the generator ran to its end, not left for the event loop to finalize


async def test_frames_that_fail_unexpectedly_end_with_an_error_event_not_a_cut_body() -> None:
    """A bug in a stream's frames (CI: uvloop's RuntimeError from a Redis call) once cut the body mid-chunk: every
    client saw 'incomplete chunked read'. Now the body ends cleanly with an internal error event, and on_close runs."""
    sent: list[dict[str, Any]] = []
    closed: list[bool] = []

    async def frames() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def close() -> None:
        closed.append(True)

    await SSEResponse(frames(), close)({"type": "http", "method": "POST"}, None, send)  # type: ignore[arg-type]
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert [m["more_body"] for m in bodies] == [True, False]
    assert b'"code":"internal_error"' in bodies[-1]["body"] and bodies[-1]["body"].endswith(b"data: [DONE]\n\n")
    assert closed == [True]
