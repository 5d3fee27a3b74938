"""deploy/grafana-dashboard.json: a datasource variable, only metrics ovq exports, queue depth that stays true with
any number of API processes (the Redis-read gauges are taken with max, never summed), panels for errors and latency.

Expressions are parsed as PromQL (promql-parser, Prometheus's grammar) after Grafana's variables are substituted.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest

from tests.deploy.conftest import DEPLOY

pytestmark = pytest.mark.deploy

# Exported by every API process from Redis on scrape: identical in each, so summing them multiplies the truth.
QUEUE_GAUGES = {"ovq_queue_waiting_jobs", "ovq_queue_in_flight_jobs", "ovq_live_workers"}
COUNTERS = {"ovq_requests_total", "ovq_request_outcomes_total", "ovq_prompt_tokens_total",
            "ovq_generation_tokens_total", "ovq_worker_jobs_taken_total", "ovq_worker_reclaimed_jobs_total"}
HISTOGRAMS = {"ovq_time_to_first_token_seconds", "ovq_inter_token_latency_seconds", "ovq_request_duration_seconds",
              "ovq_queue_time_seconds"}
WORKER_GAUGES = {"ovq_worker_running_jobs", "ovq_worker_capacity_jobs", "ovq_worker_kv_cache_usage_ratio"}
SERIES = {f"{h}_{suffix}" for h in HISTOGRAMS for suffix in ("bucket", "sum", "count")}
EXPORTED = QUEUE_GAUGES | COUNTERS | WORKER_GAUGES | SERIES


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana-dashboard.json").read_text())


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep theirs inside


def _graph_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(dashboard) if p["type"] != "row"]


def _parse(expr: str) -> Any:
    """PromQL with Grafana's variables replaced by what they expand to."""
    expr = re.sub(r"\$__(rate_)?interval|\$__range", "5m", expr)
    expr = re.sub(r"\$\{?\w+\}?", ".*", expr)
    return promql_parser.parse(expr)


def _children(node: Any) -> list[Any]:
    kind = type(node).__name__
    if kind == "BinaryExpr":
        return [node.lhs, node.rhs]
    if kind == "Call":
        return list(node.args)
    if kind == "MatrixSelector":
        return [node.vector_selector]
    if kind == "AggregateExpr":
        return [node.expr] + ([node.param] if node.param is not None else [])
    if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        return [node.expr]
    return []


def _selectors(node: Any, parents: tuple[Any, ...] = ()) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every vector selector with the nodes above it (innermost last)."""
    if type(node).__name__ == "VectorSelector":
        yield node, parents
    for child in _children(node):
        yield from _selectors(child, (*parents, node))


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _graph_panels(dashboard) for target in panel["targets"]]


def test_every_panel_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["name"] == "DS_PROMETHEUS" and variable["query"] == "prometheus"
    uid = "${DS_PROMETHEUS}"
    for panel in _graph_panels(dashboard):
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert all(t["datasource"]["uid"] == uid for t in panel["targets"]), panel["title"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == uid
            assert {s.name for s, _ in _selectors(_parse(re.sub(r"label_values\((.*), \w+\)", r"\1",
                                                                 variable["definition"])))} <= EXPORTED


def test_expressions_parse_and_use_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    expressions = _expressions(dashboard)
    assert len(expressions) >= 15
    for title, expr in expressions:
        names = {selector.name for selector, _ in _selectors(_parse(expr))}
        assert names, (title, expr)
        assert names <= EXPORTED, f"{title}: {names - EXPORTED} is not exported by ovq"


def test_queue_gauges_are_taken_with_max_by_model_and_device(dashboard: dict[str, Any]) -> None:
    seen = set()
    for title, expr in _expressions(dashboard):
        for selector, parents in _selectors(_parse(expr)):
            if selector.name not in QUEUE_GAUGES:
                continue
            seen.add(selector.name)
            enclosing = [p for p in parents if type(p).__name__ != "ParenExpr"]
            assert enclosing, f"{title}: {selector.name} unaggregated shows one line per API process"
            aggregate = enclosing[-1]
            assert type(aggregate).__name__ == "AggregateExpr", f"{title}: {expr}"
            assert str(aggregate.op) == "max", f"{title}: {selector.name} under {aggregate.op}, not max: {expr}"
            assert sorted(aggregate.modifier.labels) == ["device", "model"], f"{title}: {expr}"
            assert "By" in str(aggregate.modifier.type), f"{title}: {expr}"
    assert seen == QUEUE_GAUGES, "queue depth, in-flight jobs and live workers each have a panel"


def test_panels_for_errors_latency_throughput_and_kv_cache(dashboard: dict[str, Any]) -> None:
    used: dict[str, set[str]] = {}
    for title, expr in _expressions(dashboard):
        used.setdefault(title, set()).update(s.name for s, _ in _selectors(_parse(expr)))
    everything = "\n".join(expr for _, expr in _expressions(dashboard))
    assert any("ovq_request_outcomes_total" in names for names in used.values()), "no panel for outcomes"
    assert 'status=~"4.."' in everything and 'status=~"5.."' in everything, "no panel for 4xx/5xx rates"
    for histogram in HISTOGRAMS:
        assert re.search(rf"histogram_quantile\(0\.9\d*, sum by \(le[^)]*\) \(rate\({histogram}_bucket", everything), \
            f"no high percentile of {histogram}"
    assert re.search(r"rate\(ovq_generation_tokens_total", everything), "no tokens/s panel"
    assert any("ovq_worker_kv_cache_usage_ratio" in names for names in used.values()), "no KV cache panel"


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
