"""The chaos run's table, as the docs print it."""
from __future__ import annotations

from .checker import Report
from .faults import KINDS as FAULT_KINDS
from .records import KINDS


def p99(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]:.2f} s (n={len(ordered)})"


def render(report: Report, minutes: float) -> str:
    """`minutes`: from the workload's first request to its last answer (the drain after the last fault included)."""
    rows = [("minutes from the first request to the last answer", f"{minutes:.1f}")]
    rows += [(f"requests: {kind}", str(report.requests.get(kind, 0))) for kind in KINDS]
    rows += [(f"faults: {kind}", str(report.faults.get(kind, 0))) for kind in FAULT_KINDS]
    rows += [(f"outcome: {name}", str(count)) for name, count in sorted(report.outcomes.items())]
    rows += [("lost", str(len(report.lost))), ("hung", str(len(report.hung))),
             ("duplicated", str(len(report.duplicated))), ("mismatched", str(len(report.mismatched))),
             ("errors not a documented answer to a fault", str(len(report.unclean))),
             ("5xx other than 503", str(len(report.server_errors))),
             ("greedy streams alone compared with their reference", str(report.greedy_compared)),
             ("of those, in flight during a worker fault", str(report.continued)),
             ("of those, text other than the reference after it", str(report.flipped)),
             ("TTFT p99 (streams), during faults", p99(report.ttft_fault)),
             ("TTFT p99 (streams), calm", p99(report.ttft_calm)),
             ("Redis used_memory: baseline -> after", f"{report.memory[0]:,} -> {report.memory[1]:,} B"),
             ("Redis keys: baseline -> after", f"{report.keys[0]} -> {report.keys[1]}"),
             ("leaked keys (no TTL, by pattern)", ", ".join(f"{k} x{n}" for k, n in report.leaked_keys.items())
              or "none"),
             ("idle workers with KV cache in use", ", ".join(f"{w} {u:.3f}" for w, u in report.kv_busy.items())
              or "none")]
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'':<{width}} | value |", f"| {'-' * width} | --- |"]
    lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
    return "\n".join(lines)


def problems(report: Report, limit: int = 20) -> str:
    out = []
    for name in ("lost", "hung", "duplicated", "mismatched", "unclean", "server_errors"):
        items = getattr(report, name)
        out += [f"{name}: {item}" for item in items[:limit]]
        if len(items) > limit:
            out.append(f"{name}: ... {len(items) - limit} more")
    return "\n".join(out)
