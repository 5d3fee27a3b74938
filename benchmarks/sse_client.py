"""A load client cheap enough not to be the bottleneck: plain asyncio HTTP/1.1, one kept-alive connection per
stream, chunked SSE parsed by hand (httpx costs a whole core at about 8,000 streamed tokens/s).

`Stream` results: time to the first content token, the arrival times of content events, and the completion
tokens from the final usage chunk.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson


@dataclass
class Result:
    ok: bool = False
    sent: float = 0.0
    first: float | None = None
    times: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def stream(self, path: str, body: dict, headers: dict[str, str] | None = None) -> Result:
        """POST `body` (with "stream": true) and read the SSE answer to its end."""
        if self.writer is None or self.writer.is_closing():
            await self._open()
        assert self.reader is not None and self.writer is not None
        payload = orjson.dumps(body)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n{extra}\r\n").encode()
        result = Result(sent=time.perf_counter())
        self.writer.write(head + payload)
        status_line = await self.reader.readline()
        status = int(status_line.split(b" ", 2)[1])
        chunked, length = False, 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"content-length":
                length = int(value)
        if status != 200 or not chunked:
            data = await self.reader.readexactly(length) if length else b""
            result.error = f"HTTP {status}: {data[:200]!r}"
            return result
        buffer = b""
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                await self.reader.readline()
                break
            buffer += (await self.reader.readexactly(size + 2))[:-2]
            now = time.perf_counter()
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                self._event(event, now, result)
        result.ok = True
        return result

    @staticmethod
    def _event(event: bytes, now: float, result: Result) -> None:
        if event.startswith(b"id: "):  # a resumable stream's frame: its id line first
            event = event.partition(b"\n")[2]
        if not event.startswith(b"data: {"):
            return
        chunk = orjson.loads(event[6:])
        if chunk.get("usage"):
            result.tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices") or ():
            text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                if result.first is None:
                    result.first = now
                result.times.append(now)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def closed_loop(host: str, port: int, bodies: list[dict], concurrency: int, duration: float,
                      path: str = "/v3/chat/completions",
                      headers: dict[str, str] | list[dict[str, str]] | None = None) -> tuple[list[Result], float]:
    """`concurrency` streams, each replaced by the next as it ends, for `duration` seconds (those running then
    finish). Returns the results and the wall time. A list of `headers` is taken in turn, request by request (as
    `bodies` are): one API key a tenant, say."""
    results: list[Result] = []
    counter = iter(range(1 << 30))
    t0 = time.perf_counter()

    async def loop() -> None:
        connection = Connection(host, port)
        try:
            for i in counter:
                if time.perf_counter() - t0 > duration:
                    return
                try:
                    sent = headers[i % len(headers)] if isinstance(headers, list) else headers
                    results.append(await connection.stream(path, bodies[i % len(bodies)], sent))
                except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                    results.append(Result(error=repr(exc)))
                    connection.close()
                    connection = Connection(host, port)
        finally:
            connection.close()

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return results, time.perf_counter() - t0
