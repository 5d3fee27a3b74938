"""common/tracing.py: off by default; on, spans reach an OTLP receiver with their parents and explicit times."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from common import tracing
from tests.integration.otlp import Receiver


@pytest.fixture()
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    got = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", got.endpoint)
    monkeypatch.setattr(tracing, "_tracer", None)
    monkeypatch.setattr(tracing, "_provider", None)
    yield got
    if tracing._provider is not None:
        tracing._provider.shutdown()
    got.close()


def test_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in tracing.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracing, "_tracer", None)
    assert not tracing.setup("api", "a1") and not tracing.active()
    assert tracing.parent(None) is None and tracing.extract({}) is None


def test_a_trace_continues_from_a_traceparent_with_explicit_times(receiver: Receiver) -> None:
    assert tracing.setup("worker", "w1") and tracing.active()
    client = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    root = tracing.start("POST /v3/chat/completions", tracing.extract({"traceparent": client}))
    carried = tracing.traceparent_of(root)
    assert carried is not None and carried.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    now = time.time_ns()
    tracing.record("engine.decode", tracing.parent(carried), now - 2_000_000, now, tokens=7)
    root.end()
    tracing.flush()
    spans = {s.name: s for s in receiver.wait_for({"POST /v3/chat/completions", "engine.decode"})}
    request, decode = spans["POST /v3/chat/completions"], spans["engine.decode"]
    assert request.trace_id == decode.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert request.parent_id == "b7ad6b7169203331" and decode.parent_id == request.span_id
    assert decode.end_ns - decode.start_ns == 2_000_000 and decode.attributes["tokens"] == 7
    assert decode.service == "ovq-worker"
