"""api/ops/view.py: latencies with one unit, windows named as the page labels them, the worker rate's window."""
from __future__ import annotations

from api.ops import view
from common.ops import stats
from workers.queue.heartbeat import Rate


def test_three_percentiles_share_one_unit() -> None:
    assert view.ms3({"p50": 12.2, "p90": 15.0, "p99": 31.4}) == "12 / 15 / 31 ms"
    assert view.ms3({"p50": 850.0, "p90": 1200.0, "p99": 2400.0}) == "0.85 / 1.20 / 2.40 s"
    assert view.ms3({"p50": None, "p90": None, "p99": None}) == "–"


def test_windows_are_named_from_the_numbers_that_make_them() -> None:
    assert [view.span(s) for s in (10, 60, 300, 90)] == ["10 s", "1 min", "5 min", "90 s"]
    assert view.WINDOWS == {"rate": view.span(stats.RATE_SPAN_S), "span": view.span(stats.SPAN_S),
                            "point": view.span(stats.WINDOW_S), "worker": "10 s"}


def test_the_worker_rate_window_is_the_one_its_heartbeat_measures() -> None:
    assert view.WORKER_RATE_S == Rate.RATE_WINDOW_S
