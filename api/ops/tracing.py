"""One request's spans in the API, for operators following a request across the tiers (common/tracing.py).

The request's SERVER span is open from the start (under the client's `traceparent` when it sent one), so its
context can go into the job and the worker's spans join it. Its phases are marked as they pass, a clock reading
each, and recorded as child spans with those times when the request ends: validation and template rendering, the
enqueue, the wait in the queue (until every worker accepted), and the response (until its last byte).
"""
from __future__ import annotations

import time
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.requests import Request

from common import tracing

PHASES = (("validate", "start", "validated"), ("enqueue", "validated", "enqueued"),
          ("queue.wait", "enqueued", "accepted"), ("respond", "accepted", "end"))


class RequestTrace:
    def __init__(self, request: Request, endpoint: str) -> None:
        self.marks = {"start": time.time_ns()}
        path = request.url.path
        self.span = tracing.start(f"{request.method} {path}", tracing.extract(request.headers), SpanKind.SERVER,
                                  self.marks["start"], **{"http.request.method": request.method, "url.path": path,
                                                          "ovq.endpoint": endpoint})
        self.traceparent = tracing.traceparent_of(self.span)

    def mark(self, name: str) -> None:
        self.marks[name] = time.time_ns()

    def end(self, status: int, outcome: str, attributes: dict[str, Any]) -> None:
        """The request's last byte went out (or it failed): its phases, then its own span, end now."""
        self.mark("end")
        for name, begin, finish in PHASES:
            if begin in self.marks and finish in self.marks:
                tracing.record(name, self.span, self.marks[begin], self.marks[finish])
        self.span.set_attributes({"http.response.status_code": status, "ovq.outcome": outcome,
                                  **{k: v for k, v in attributes.items() if v not in (None, "")}})
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, outcome))
        self.span.end(end_time=self.marks["end"])
