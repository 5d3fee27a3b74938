"""`ovq plan`: how many API processes, Redis masters and workers a target load needs, from measured unit costs
(`cli/capacity.py`; docs/how-to/capacity.md)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from pydantic import ValidationError
from rich.table import Table

from cli.capacity import COSTS_FILE, TIERS, Costs, Load, plan
from cli.console import console, error, print_json


def _load(args: argparse.Namespace) -> Load:
    tokens_per_s = args.requests_per_s * args.tokens
    workers = args.workers
    if workers is None:
        workers = max(1, math.ceil(tokens_per_s / (args.worker_tokens_per_s * args.headroom)))
    streams = args.streams
    if streams is None:
        streams = max(1, math.ceil(args.requests_per_s * args.seconds_per_request))
    return Load(requests_per_s=args.requests_per_s, tokens_per_s=tokens_per_s, streams=streams, workers=workers,
                apis=1, tenants=args.tenants)


def run(args: argparse.Namespace) -> int:
    try:
        costs = Costs.load(args.costs)
    except (OSError, ValidationError) as exc:
        error(f"cannot read the unit costs {args.costs or COSTS_FILE}: {exc}")
        return 2
    try:
        load = _load(args)
    except ValidationError as exc:
        error("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
        return 2
    result = plan(load, costs, args.headroom)
    if args.json:
        print_json(result.model_dump())
        return 0
    out = console()
    sized = result.load
    out.print(f"load: {sized.requests_per_s:g} requests/s x {args.tokens} tokens = {sized.tokens_per_s:g} tokens/s, "
              f"{sized.streams} streams in flight, {sized.workers} workers ({sized.steps_per_s:.0f} engine steps/s)"
              + (f", {sized.tenants} tenants" if sized.tenants else ""))
    table = Table(title="CPU by tier (cores)", title_justify="left")
    for name in ("tier", "cores", "deploy"):
        table.add_column(name, justify="left" if name == "tier" else "right")
    deploy = {"api": f"{result.api_processes} API process(es)", "redis": f"{result.redis_masters} Redis master(s)",
              "workers": f"{sized.workers} worker(s) (I/O half; the engine's CPU is extra)"}
    for tier in TIERS:
        table.add_row(tier, f"{result.cores[tier]:.2f}", deploy[tier])
    out.print(table)
    out.print(f"first limits at this request shape, {args.headroom:.0%} of a core each: one Redis master "
              f"{_rate(result.redis_jobs_per_s_limit)}, one API process {_rate(result.api_jobs_per_s_limit)}")
    out.print(f"unit costs: {costs.measured}", style="dim")
    return 0


def _rate(limit: float | None) -> str:
    return "no limit (requests cost it nothing)" if limit is None else f"{limit:,.0f} requests/s"


def _positive(value: str) -> float:
    number = float(value)
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {value}")
    return number


def _fraction(value: str) -> float:
    number = _positive(value)
    if number > 1:
        raise argparse.ArgumentTypeError(f"a fraction of a core, at most 1, not {value}")
    return number


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="API processes, Redis masters and workers for a target load (capacity model)")
    p.add_argument("--requests-per-s", type=_positive, required=True, help="requests a second, all models together")
    p.add_argument("--tokens", type=int, default=128, help="streamed (output) tokens per request")
    p.add_argument("--streams", type=int, help="requests in flight at once (default: requests/s x "
                   "--seconds-per-request)")
    p.add_argument("--seconds-per-request", type=_positive, default=5.0, help="a request's time from send to its "
                   "last token, for the default --streams")
    workers = p.add_mutually_exclusive_group(required=True)
    workers.add_argument("--workers", type=int, help="the workers serving the load")
    workers.add_argument("--worker-tokens-per-s", type=_positive, help="what one worker's engine streams a second at "
                         "its batch size (measure it: benchmarks/serving.py); the workers are sized from it")
    p.add_argument("--tenants", type=int, default=0, help="tenants sharing the models through API keys (default 0: "
                   "no keys, no fair shares)")
    p.add_argument("--headroom", type=_fraction, default=0.7, help="the busiest a core may be (default 0.7)")
    p.add_argument("--costs", type=Path, help="unit costs measured on your machines (benchmarks/capacity.py --write "
                   "COSTS.json); default: the ones ovq ships, measured on a 2-core box")
    p.add_argument("--json", action="store_true", help="the plan as JSON")
    p.set_defaults(func=run)
