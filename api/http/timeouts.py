"""uvicorn's httptools protocol with the timeouts uvicorn lacks; `python -m api` runs with it (`http=`).

uvicorn only times out a keep-alive connection between requests (`OVQ_KEEP_ALIVE_S`): a connection that sends
its headers a byte at a time (slowloris), never finishes its body, or never reads its answer is held for good.
This subclass adds, per connection, one timer at a time:

- headers: a request's headers must be complete within `OVQ_HEADER_TIMEOUT_S` of the connection opening or of
  the request's first byte, else the connection is closed (an idle new connection included);
- body: once the headers are in, the body must be complete within `OVQ_BODY_TIMEOUT_S`;
- write: while the answer waits on a client that reads nothing (the transport's buffer over its high-water
  mark), for at most `OVQ_WRITE_TIMEOUT_S`; then the connection is aborted, which the application sees as a
  disconnect (a stream's job is cancelled). What the kernel buffers comes first: Linux grows a connection's
  send buffer up to 4 MB; `OVQ_SEND_BUFFER_BYTES` fixes it smaller (less memory per slow client, and the
  write timeout starts sooner).

And an answer sent before its request's body was all received (a refusal: 401, 413, 415, ...) closes the
connection after it, so a client cannot keep one open by trickling a body nobody reads.
"""
from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from common.settings import get_settings


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.header_timeout = settings.header_timeout_s
        self.body_timeout = settings.body_timeout_s
        self.write_timeout = settings.write_timeout_s
        self.send_buffer = settings.send_buffer_bytes
        self.read_timer: asyncio.TimerHandle | None = None  # headers, then body
        self.write_timer: asyncio.TimerHandle | None = None

    def _arm_read(self, delay: float, what: str) -> None:
        self._cancel_read()
        self.read_timer = self.loop.call_later(delay, self._timed_out, what, delay)

    def _cancel_read(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def _timed_out(self, what: str, delay: float) -> None:
        self.read_timer = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request %s did not arrive within %.0fs", what, delay)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if self.send_buffer and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        self._arm_read(self.header_timeout, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.read_timer is None:
            self._arm_read(self.header_timeout, "headers")

    def on_headers_complete(self) -> None:
        self._cancel_read()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.more_body:
            self._arm_read(self.body_timeout, "body")

    def on_message_complete(self) -> None:
        self._cancel_read()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        done = self.cycle  # with no pipelined request queued, the cycle whose answer just ended
        if not self.pipeline and done is not None and done.more_body and not self.transport.is_closing():
            self.transport.close()  # answered before the body was in: do not read the rest
        super().on_response_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_timer is None:
            self.write_timer = self.loop.call_later(self.write_timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _write_timed_out(self) -> None:
        self.write_timer = None
        self.logger.info("client read nothing for %.0fs: closing its connection", self.write_timeout)
        self.transport.abort()  # close() would wait for the buffer to drain, which is what never happens

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read()
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        super().connection_lost(exc)
