"""A worker's small HTTP port (OVQ_WORKER_PORT): `/live`, `/ready` and `/metrics` for probes and Prometheus.

Plain asyncio on the worker's own loop: a probe that gets an answer has seen that loop turn.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from workers.ops.metrics import render
from workers.vitals import Member, Vitals

log = logging.getLogger("ovq.worker.health")
REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


def readiness(vitals: Vitals, heartbeat_s: float) -> tuple[bool, str]:
    """Whether the worker should get jobs, and why not: draining, no engine, or Redis silent for three beats."""
    if vitals.draining:
        return False, "draining"
    if not vitals.engine_alive and vitals.state == "awake":  # asleep, a job wakes it: ready all the same
        return False, "engine not running"
    if vitals.redis_silent_s > 3 * heartbeat_s + 1:
        return False, "Redis unreachable"
    return True, "ready"


class HealthServer:
    def __init__(self, member: Member, vitals: Callable[[], Vitals], heartbeat_s: float, host: str,
                 port: int) -> None:
        self.member, self.vitals, self.heartbeat_s = member, vitals, heartbeat_s
        self.host, self.port = host, port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("worker %s: probes and metrics on http://%s:%d/", self.member.id, self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

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
            return 200, orjson.dumps({"live": True, "worker": self.member.id}), "application/json"
        if path == "/ready":
            ok, why = readiness(self.vitals(), self.heartbeat_s)
            return (200 if ok else 503), orjson.dumps({"ready": ok, "reason": why}), "application/json"
        if path == "/metrics":
            return 200, render(self.member, self.vitals()), CONTENT_TYPE_LATEST
        return 404, b'{"error": "not found"}', "application/json"
