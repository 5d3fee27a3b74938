"""A text/event-stream response written straight to the connection, one write per batch of ready-made frames.

The frames come as bytes from the response's own loop (which batches everything a wake-up brought), so there is
no framework object, encoding step or cancel scope per event: that was most of the API's cost per streamed token.
The client leaving is noticed by the generation's own watcher (api/jobs.py), which ends the loop.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"


def frame(data: bytes, event: bytes | None = None) -> bytes:
    return (b"event: " + event + b"\ndata: " if event else b"data: ") + data + b"\n\n"


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]],
                 headers: Mapping[str, str] | None = None) -> None:
        # No body and no Content-Length (Response.__init__ would set one): the frames follow as they come.
        self.status_code, self.background = 200, None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})})
        self.frames, self.on_close = frames, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            # The body goes through the server's own send (see api/front.py): the framework's wrappers only watch for
            # the response start, and cost an await each per chunk.
            body = scope.get("ovq.send", send)
            if scope.get("method") != "HEAD":
                async for data in self.frames:
                    await body({"type": "http.response.body", "body": data, "more_body": True})
            await body({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write: nothing to tell it
            pass
        finally:
            await self.on_close()

