"""`ovq status`: every model's streams (waiting, in flight), the workers, the API processes and the dead letters,
read from Redis as the ops page reads them."""
from __future__ import annotations

import argparse

import redis.asyncio as aioredis
from rich.table import Table

from cli.console import console, print_json, run
from common.keys import Keys
from common.ops import cluster
from common.settings import Settings


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def streams_table(overview: cluster.Overview) -> Table:
    table = Table(title="Streams", title_justify="left")
    for name in ("model", "device", "stream"):
        table.add_column(name)
    for name in ("waiting", "in flight", "high/low waiting", "batch waiting/in flight", "workers", "consumers",
                 "tok/s", "req/s", "TTFT p50/p99 ms", "errors 5m"):
        table.add_column(name, justify="right")
    table.add_column("Redis node")
    for s in overview.streams:
        st = s.stats
        rates = [f"{st.tokens_per_s:.1f}", f"{st.requests_per_s:.2f}",
                 f"{_ms(st.ttft_ms['p50'])}/{_ms(st.ttft_ms['p99'])}", str(st.error)] if st else ["-"] * 4
        waiting = f"{s.waiting} ({s.affinity_waiting} affine)" if s.affinity_waiting else str(s.waiting)
        table.add_row(s.model, s.device, s.stream, waiting, str(s.in_flight),
                      f"{s.high_waiting}/{s.low_waiting}", f"{s.batch_waiting}/{s.batch_in_flight}", str(s.workers),
                      str(s.consumers), *rates, s.node)
    return table


def workers_table(overview: cluster.Overview) -> Table:
    table = Table(title="Workers", title_justify="left")
    for name in ("worker", "model", "device", "host", "servable"):
        table.add_column(name)
    for name in ("running", "capacity", "KV cache", "tok/s", "heartbeat"):
        table.add_column(name, justify="right")
    table.add_column("state")
    for w in overview.workers:
        state = "draining" if w.draining else "drain requested" if w.drain_requested else \
            "serving" if w.state == "awake" else w.state
        if w.pool:
            state += " (pool)"
        table.add_row(w.id, w.model, w.device, w.host, w.servable_type, str(w.running), str(w.capacity),
                      f"{w.kv_cache_usage:.0%}", f"{w.tokens_per_s:.1f}", f"{w.age_s:.1f}s ago", state)
    return table


def pools_table(overview: cluster.Overview) -> Table:
    table = Table(title="Pool workers", title_justify="left")
    for name in ("pool", "device", "host", "models (state)"):
        table.add_column(name)
    for name in ("memory MiB used/budget", "loads", "unloads", "mean load s", "heartbeat"):
        table.add_column(name, justify="right")
    for p in overview.pools:
        models = ", ".join(f"{m.model} ({m.state})" for m in p.models) or "-"
        mean = f"{p.load_s / p.loads:.2f}" if p.loads else "-"
        table.add_row(p.id, p.device, p.host, models, f"{p.used >> 20}/{p.budget >> 20}", str(p.loads),
                      str(p.unloads), mean, f"{p.age_s:.1f}s ago")
    return table


async def _status(redis: aioredis.Redis, keys: Keys, settings: Settings, as_json: bool) -> int:
    overview = await cluster.overview(redis, keys, settings, rows=0)
    if as_json:
        print_json(overview.model_dump(mode="json", exclude={"dead", "failures"}))
        return 0
    out = console()
    if overview.streams:
        out.print(streams_table(overview))
    else:
        out.print("No model announced by a worker (is a worker running against this Redis and key prefix?)")
    if overview.workers:
        out.print(workers_table(overview))
    if overview.pools:
        out.print(pools_table(overview))
    out.print(f"API processes: {len(overview.apis)}    dead letters: {overview.dead_letters}"
              + ("  (ovq dead list)" if overview.dead_letters else ""))
    return 0


def status(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _status(redis, keys, settings, args.json))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="streams, backlog, workers, API processes and dead letters, from Redis")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=status)
