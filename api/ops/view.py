"""How the ops page shows numbers: durations, ages, rates, and the small rate charts (inline SVG points)."""
from __future__ import annotations

import time
from collections.abc import Sequence

from common.ops.stats import Point

CHART_W, CHART_H = 240, 48


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"


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


FILTERS = {"ms": ms, "ago": ago, "clock": clock, "rate": rate}
