"""A text/event-stream response written straight to the connection, one write per batch of ready-made frames.

The frames come as bytes from the response's own loop (which batches everything a wake-up brought), so there is
no framework object, encoding step or cancel scope per event: that was most of the API's cost per streamed token.
The client leaving is noticed by the generation's own watcher (api/queue/client.py), which ends the loop.

On uvicorn's httptools server the response also offers a synchronous `Write` of one frame to the connection
(`DirectWrite`): the event hub uses it for plain text deltas, so a streamed token needs no task wake-up at all.
It declines (returns False) whenever the server would have made the response wait (the client reading slowly:
flow control) or could not write (gone, complete); the frame then takes the response's own loop. There the head
(`HeldHead`) waits for the first frame, when that is ready at once, to go out in the same write: one syscall, and
one wake-up of the client, less per response (a short request's answer was four writes).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger("ovq.api")
Write = Callable[[bytes], bool]
PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
# The end of a stream whose frames failed unexpectedly (a bug): the client still gets a clean, final error event
# (the OpenAI SDKs raise it as an APIError), not a body cut mid-chunk.
FAILED = (b"data: " + orjson.dumps({"error": {"message": "internal error", "type": "server_error", "param": None,
                                              "code": "internal_error"}}) + b"\n\n")


class Last(bytes):
    """A stream's final frames: they go out with the end of the body in one write (a finish, the usage and
    `[DONE]` were four writes, and four trips through the server's send, per response)."""


def frame(data: bytes, event: bytes | None = None) -> bytes:
    return (b"event: " + event + b"\ndata: " if event else b"data: ") + data + b"\n\n"


_CYCLE = ("transport", "flow", "disconnected", "response_complete", "chunked_encoding")


class DirectWrite:
    """Writes a chunk of a started chunked body as uvicorn's httptools `send` would, without awaiting.

    Declines while the response's own loop has frames in flight (`busy`: they must go first) and whenever the
    server would have made the response wait or could not write."""

    def __init__(self, cycle: Any) -> None:
        self.cycle, self.busy = cycle, False

    @classmethod
    def of(cls, scope: Scope) -> DirectWrite | None:
        """None on any other server (h11, a test client)."""
        cycle = _cycle(scope)
        return cls(cycle) if cycle is not None else None

    def __call__(self, data: bytes) -> bool:
        if not data:  # an empty chunk would end the body
            return True
        cycle = self.cycle
        if (self.busy or cycle.disconnected or cycle.flow.write_paused or cycle.response_complete
                or cycle.chunked_encoding is not True):
            return False
        try:
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        except Exception:  # a transport closing under us: the response's own loop finds out and ends
            return False
        return True


class HeldHead:
    """Stands in for the connection while uvicorn writes the response head, and keeps it: it goes out with the
    first frame in one write (`merge`), or alone (`flush`) if that frame is not ready by the loop's next turn."""

    def __init__(self, cycle: Any) -> None:
        self.cycle, self.transport, self.data = cycle, cycle.transport, b""

    def write(self, data: bytes) -> None:
        self.data += data

    def merge(self, frame: bytes) -> bool:
        """The head with `frame` as the body's first chunk; False when the head went out already, or the server
        could not write now (the frame then takes the server's own send)."""
        cycle = self.cycle
        if not self.data or not frame or cycle.disconnected or cycle.flow.write_paused:
            return False
        data, self.data = self.data, b""
        _write(self.transport, data + b"%x\r\n%b\r\n" % (len(frame), frame))
        return True

    def flush(self) -> None:
        if self.data:
            data, self.data = self.data, b""
            _write(self.transport, data)


def _write(transport: Any, data: bytes) -> None:
    try:
        transport.write(data)
    except Exception:  # a transport closing under us: the response's own loop finds out and ends
        pass


def _cycle(scope: Scope) -> Any:
    """uvicorn's httptools request cycle behind the scope's server send, or None (h11, a test client)."""
    cycle = getattr(scope.get("ovq.send"), "__self__", None)
    return cycle if cycle is not None and all(hasattr(cycle, name) for name in _CYCLE) else None


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]],
                 headers: Mapping[str, str] | None = None, on_write: Callable[[Write], None] | None = None) -> None:
        # No body and no Content-Length (Response.__init__ would set one): the frames follow as they come.
        self.status_code, self.background = 200, None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})})
        self.frames, self.on_close, self.on_write = frames, on_close, on_write

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ended, body = False, send
        head: HeldHead | None = None

        async def write(data: bytes, more: bool) -> None:
            nonlocal head
            if head is not None:  # the first chunk: with the head, when it is still held
                held, head = head, None
                if more and held.merge(data):
                    return
                held.flush()
            await body({"type": "http.response.body", "body": data, "more_body": more})

        try:
            head = await self._start(scope, send)
            # The body goes through the server's own send (see api/http/front.py): the framework's wrappers only
            # watch for the response start, and cost an await each per chunk.
            body = scope.get("ovq.send", send)
            if scope.get("method") != "HEAD":
                direct = DirectWrite.of(scope) if self.on_write is not None else None
                if direct is not None:
                    self.on_write(direct)
                async for data in self.frames:  # to the generator's end: its own cleanup runs now
                    if ended:
                        continue
                    if direct is not None:
                        direct.busy = True  # until written: a direct write now would overtake these frames
                    ended = type(data) is Last
                    await write(data, not ended)
                    if direct is not None:
                        direct.busy = ended  # nothing may follow the end of the body
            if not ended:
                await write(b"", False)
        except OSError:  # the client went away mid-write: nothing to tell it
            pass
        except Exception:
            log.exception("a stream failed unexpectedly; it ends with an internal error event")
            if not ended:
                try:
                    await write(FAILED + DONE, False)
                except OSError:
                    pass
        finally:
            if head is not None:
                head.flush()
            await self.on_close()

    async def _start(self, scope: Scope, send: Send) -> HeldHead | None:
        """Sends the response start; on uvicorn's httptools server the head it writes is held (`HeldHead`) until
        the first frame or the loop's next turn, whichever comes first."""
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        cycle = _cycle(scope) if scope.get("method") != "HEAD" else None
        if cycle is None:
            await send(start)
            return None
        head = HeldHead(cycle)
        cycle.transport = head
        try:
            await send(start)
        finally:
            cycle.transport = head.transport
        asyncio.get_running_loop().call_soon(head.flush)
        return head

