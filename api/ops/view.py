"""How the ops page shows numbers: durations, ages, rates, and the small rate charts (inline SVG points)."""
from __future__ import annotations

import time
from collections.abc import Sequence

from common.ops.stats import RATE_SPAN_S, SPAN_S, WINDOW_S, Point

CHART_W, CHART_H = 150, 36
# A worker's tokens/s comes with its heartbeat, over about its last 10 s (workers/queue/heartbeat.py `Rate`; a
# test keeps the two equal: the page cannot import the worker tier).
WORKER_RATE_S = 10


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def ms3(values: dict[str, float | None]) -> str:
    """p50 / p90 / p99 with one unit for the three: `12 / 15 / 31 ms`, `0.85 / 1.20 / 2.40 s`."""
    found = [values.get(k) for k in ("p50", "p90", "p99")]
    if all(v is None for v in found):
        return "–"
    in_s = max(v for v in found if v is not None) >= 1000
    shown = ["–" if v is None else f"{v / 1000:.2f}" if in_s else f"{v:.0f}" for v in found]
    return " / ".join(shown) + (" s" if in_s else " ms")


def span(seconds: float) -> str:
    """A window's length as the page labels it: `10 s`, `1 min`, `5 min`."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def rate(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def line(values: Sequence[float], top: float) -> str:
    """SVG polyline points of `values` scaled so `top` reaches the chart's top edge (a flat line at 0 if all 0)."""
    if not values:
        return ""
    step = CHART_W / max(len(values) - 1, 1)
    scale = (CHART_H - 2) / top if top > 0 else 0.0
    return " ".join(f"{i * step:.1f},{CHART_H - 1 - v * scale:.1f}" for i, v in enumerate(values))


def chart(series: Sequence[Point]) -> dict[str, object]:
    """Tokens/s and requests/s over the windows, each on its own scale (labelled with its peak)."""
    tokens = [p.tokens_per_s for p in series]
    requests = [p.requests_per_s for p in series]
    top_tokens, top_requests = max(tokens, default=0.0), max(requests, default=0.0)
    return {"width": CHART_W, "height": CHART_H, "tokens": line(tokens, top_tokens),
            "requests": line(requests, top_requests), "top_tokens": top_tokens, "top_requests": top_requests}


FILTERS = {"ms": ms, "ms3": ms3, "span": span, "ago": ago, "clock": clock, "rate": rate}
# Every rate on the page says the window it is over.
WINDOWS = {"rate": span(RATE_SPAN_S), "span": span(SPAN_S), "point": span(WINDOW_S), "worker": span(WORKER_RATE_S)}
