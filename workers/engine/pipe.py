"""The I/O half's end of the engine pipes, on the event loop: frames of any size, never a partial write.

The engine process uses plain blocking `multiprocessing.Connection`s (one pipe each way); this side speaks the
same framing (a 4-byte big-endian length, or -1 and an 8-byte length for frames over 2 GiB) through asyncio
pipe transports. A transport buffers what the pipe cannot take yet, so a 50 MB prompt neither blocks the
event loop nor tears a frame, and "the pipe is full" (EAGAIN) is never mistaken for a dead engine.
"""
from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Callable
from typing import Any

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")


def frame(payload: bytes) -> bytes:
    if len(payload) > 0x7FFFFFFF:
        return _SHORT.pack(-1) + _LONG.pack(len(payload)) + payload
    return _SHORT.pack(len(payload)) + payload


class FrameReader(asyncio.Protocol):
    """Calls `on_frame(payload)` for each whole frame, `on_close()` once the engine's end is closed."""

    def __init__(self, on_frame: Callable[[bytes], None], on_close: Callable[[], None]) -> None:
        self.on_frame, self.on_close = on_frame, on_close
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while True:
            if len(buffer) < 4:
                return
            size = _SHORT.unpack_from(buffer)[0]
            start = 4
            if size == -1:
                if len(buffer) < 12:
                    return
                size = _LONG.unpack_from(buffer, 4)[0]
                start = 12
            if len(buffer) < start + size:
                return
            payload = bytes(buffer[start:start + size])
            del buffer[:start + size]
            self.on_frame(payload)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_close()


class EnginePipes:
    """Async ends of the two pipes to one engine process: `send(payload)` and a reader calling back."""

    def __init__(self) -> None:
        self._writer: asyncio.WriteTransport | None = None
        self._reader: asyncio.ReadTransport | None = None
        self._files: list[Any] = []

    async def open(self, read_fd: int, write_fd: int, on_frame: Callable[[bytes], None],
                   on_close: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        # Own duplicates: the transports close their files, the Connections their own descriptors.
        reader_file = os.fdopen(os.dup(read_fd), "rb", buffering=0)
        writer_file = os.fdopen(os.dup(write_fd), "wb", buffering=0)
        self._files = [reader_file, writer_file]
        self._reader, _ = await loop.connect_read_pipe(lambda: FrameReader(on_frame, on_close), reader_file)
        self._writer, _ = await loop.connect_write_pipe(asyncio.Protocol, writer_file)

    def send(self, payload: bytes) -> bool:
        """Queue one frame; False when the engine's end is gone (its death is reported by the reader)."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return False
        writer.write(frame(payload))
        return True

    @property
    def buffered(self) -> int:
        """Bytes written but not yet taken by the engine (a stalled engine lets this grow)."""
        return self._writer.get_write_buffer_size() if self._writer is not None else 0

    def close(self) -> None:
        for transport in (self._writer, self._reader):
            if transport is not None:
                transport.close()
        self._writer = self._reader = None
