"""A small OTLP/HTTP trace receiver for tests: what the tiers' exporters send, decoded with OpenTelemetry's protos."""
from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                spans.append(ReceivedSpan(s.name, resource.get("service.name", ""), s.trace_id.hex(), s.span_id.hex(),
                                          s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano,
                                          {a.key: _value(a.value) for a in s.attributes}))
    return spans


class Receiver:
    """Listens on 127.0.0.1:<free port> for POST /v1/traces until closed."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.spans.extend(_decode(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, names: set[str], trace_id: str | None = None, timeout: float = 30) -> list[ReceivedSpan]:
        """The spans of one trace once every name in `names` has arrived (any trace's when no id is given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                spans = [s for s in self.spans if trace_id is None or s.trace_id == trace_id]
            if names <= {s.name for s in spans}:
                return spans
            time.sleep(0.1)
        raise AssertionError(f"spans {sorted(names - {s.name for s in spans})} never arrived; got "
                             f"{sorted((s.service, s.name) for s in spans)}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
