"""OpenTelemetry traces across the tiers: one request, one trace, whichever hosts its API and worker run on.

Off unless asked for: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, or `OVQ_TRACING` is true
(then the exporter's own default, http://localhost:4318). The SDK and the OTLP exporter are the `tracing`
extra (`pip install 'ovq[tracing]'`); asked for without them, a process says so in one log line and runs untraced.

Off, a span site costs one test of `active()`: nothing here is called, no context is made or carried. On, spans
go out in batches from a thread of the SDK's (BatchSpanProcessor), never on the event loop's path.

The context travels inside the job as a W3C `traceparent` string (the client's own header when it sent one), so
a worker on any host continues the API's trace. The worker knows its spans' times only after the fact (the engine
process reports them with the step's events), so its spans are recorded with explicit start and end times.
"""
from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("ovq.tracing")

TRACEPARENT = "traceparent"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_propagator = TraceContextTextMapPropagator()
_tracer: Tracer | None = None
_provider: Any = None  # the SDK's TracerProvider, once set up


def wanted(flag: bool = False) -> bool:
    return flag or any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def setup(service: str, instance: str, flag: bool = False) -> bool:
    """Install an exporting tracer for this process when tracing is asked for; True when it is on."""
    global _tracer, _provider
    if _tracer is not None or not wanted(flag):
        return _tracer is not None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("tracing was asked for (OVQ_TRACING or OTEL_EXPORTER_OTLP_ENDPOINT) but the OpenTelemetry SDK "
                    "is not installed (pip install 'ovq[tracing]'): this process runs untraced")
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": f"ovq-{service}",
                                                        "service.instance.id": instance}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    atexit.register(provider.shutdown)  # what is still batched goes out at a clean exit
    _provider, _tracer = provider, provider.get_tracer("ovq")
    log.info("tracing on: spans of %s go to %s", service,
             next((os.environ[n] for n in ENDPOINT_VARIABLES if os.environ.get(n)), "http://localhost:4318"))
    return True


def active() -> bool:
    return _tracer is not None


def now_ns() -> int:
    return time.time_ns()


def flush() -> None:
    """Send what is batched now (a draining process calls this before it exits; bounded by 5 s)."""
    if _provider is not None:
        _provider.force_flush(5000)


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The caller's context from a `traceparent` (HTTP headers, or a job's field); None when it has none."""
    if not headers or not headers.get(TRACEPARENT):
        return None
    return _propagator.extract({TRACEPARENT: headers[TRACEPARENT]})


def parent(traceparent: str | None) -> Context | None:
    return extract({TRACEPARENT: traceparent}) if traceparent else None


def traceparent_of(span: Span) -> str | None:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def start(name: str, context: Context | Span | None = None, kind: SpanKind = SpanKind.INTERNAL,
          start_ns: int | None = None, **attributes: Any) -> Span:
    """A span under `context` (a Context, or a parent Span); call only when `active()`."""
    assert _tracer is not None
    if isinstance(context, Span):
        context = trace.set_span_in_context(context)
    return _tracer.start_span(name, context=context, kind=kind, start_time=start_ns,
                              attributes={k: v for k, v in attributes.items() if v is not None})


def record(name: str, context: Context | Span | None, start_ns: int, end_ns: int, **attributes: Any) -> Span:
    """A span whose times are already known (the worker learns them from the engine after the fact)."""
    span = start(name, context, start_ns=start_ns, **attributes)
    span.end(end_time=max(end_ns, start_ns))
    return span
