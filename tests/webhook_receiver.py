"""A webhook receiver for tests: an HTTP server on loopback (a thread) that verifies every delivery with the
`standardwebhooks` library's verifier and records it; `answers` scripts its status codes, and `hold` keeps a request
unanswered until released (or the client is gone)."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook

from common.webhooks.endpoints import new_secret


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes
    status: int
    verified: bool

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def event(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    secret: str = field(default_factory=new_secret)
    answers: list[int] = field(default_factory=list)  # statuses of the next requests, in order; then 200
    hold_next: bool = False  # the next request is held until `release` (its client may die meanwhile)
    received: list[Received] = field(default_factory=list)
    held: threading.Event = field(default_factory=threading.Event)  # set when a request is being held
    release: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    Webhook(receiver.secret).verify(body, headers)
                    verified = True
                except Exception:
                    verified = False
                hold, receiver.hold_next = receiver.hold_next, False
                status = receiver.answers.pop(0) if receiver.answers else 200
                receiver.received.append(Received(time.time(), headers, body, status if not hold else 0, verified))
                if hold:
                    receiver.held.set()
                    receiver.release.wait(120)
                    return  # never answered: its client died meanwhile
                try:
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 60) -> list[Received]:
        """Until `count` requests were answered 2xx (or held); all received so far."""
        deadline = time.monotonic() + timeout
        while sum(1 for r in self.received if r.status // 100 == 2) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} received: {self.received}"
            time.sleep(0.05)
        return list(self.received)

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
