"""Ollama's `keep_alive`: how long a model stays loaded after a request, as a request field and a setting.

Ollama takes a number of seconds or a Go duration string (`"5m"`, `"1h30m"`, `"90s"`, `"-1m"`); any negative value
keeps the model loaded for good, 0 unloads it as soon as it is idle. Here it is seconds (a float) from then on.
"""
from __future__ import annotations

import math
import re

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse(value: float | int | str) -> float:
    """Seconds; ValueError for what Ollama would refuse."""
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number of seconds or a duration such as \"5m\"")
    if isinstance(value, int | float):
        return _finite(float(value), value)
    text = value.strip()
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    try:
        return _finite(sign * float(body), value)  # "300": seconds, as Ollama reads a bare number
    except ValueError:
        pass
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {value!r} is not a duration (such as \"5m\", \"1h30m\", \"-1\")")
    return sign * sum(float(n) * UNITS[u] for n, u in parts)


def _finite(seconds: float, value: object) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"keep_alive {value!r} is not a duration (such as \"5m\", \"1h30m\", \"-1\")")
    return seconds
