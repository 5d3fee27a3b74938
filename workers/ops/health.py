"""A worker's small HTTP port (OVQ_WORKER_PORT): `/live`, `/ready` and `/metrics` for probes and Prometheus.

Plain asyncio on the worker's own loop: a probe that gets an answer has seen that loop turn.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from workers.ops.metrics import render

if TYPE_CHECKING:
    from workers.base import BaseWorker

log = logging.getLogger("ovq.worker.health")
REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


class HealthServer:
    def __init__(self, worker: BaseWorker, host: str, port: int) -> None:
        self.worker, self.host, self.port = worker, host, port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("worker %s: probes and metrics on http://%s:%d/", self.worker.id, self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def ready(self) -> tuple[bool, str]:
        w = self.worker
        if w.draining:
            return False, "draining"
        if not w.backend_alive:
            return False, "engine not running"
        if time.monotonic() - w.heartbeat.last_ok > 3 * w.settings.heartbeat_s + 1:
            return False, "Redis unreachable"
        return True, "ready"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].split(b"?")[0].decode() if request.count(b" ") >= 2 else ""
            status, body, kind = self._answer(path)
            head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, path: str) -> tuple[int, bytes, str]:
        if path == "/live":
            return 200, orjson.dumps({"live": True, "worker": self.worker.id}), "application/json"
        if path == "/ready":
            ok, why = self.ready()
            return (200 if ok else 503), orjson.dumps({"ready": ok, "reason": why}), "application/json"
        if path == "/metrics":
            return 200, render(self.worker), CONTENT_TYPE_LATEST
        return 404, b'{"error": "not found"}', "application/json"
