#!/usr/bin/env python3
"""The capacity model's unit costs, measured, and the model checked against measurement (issue 40, item 5).

Each point is a fresh `benchmarks/fleet_scale.py` stack (simulated engines behind the real API, worker I/O halves
and Redis): N workers, A API processes, C closed-loop streams of T tokens. Its idle phase and its load phase give,
per tier (API, workers, Redis), CPU seconds per second against what `ovq plan` takes as the load: requests/s,
tokens/s, the fleet's engine steps/s (`Load.steps_per_s`: tokens/s over streams per busy worker), workers, API
processes and tenants (K API keys, one tenant each, taken in turn).

  calibrate: idle CPU per worker and per API process from the idle phases (least squares), then per request, per
             token, per step and per tenant request from the load phases less that idle cost (least squares, no
             negative cost);
  check:     at the check points (three fleet sizes, and one with tenants), what the model predicts for each tier
             against what was measured, with the error in %.

  python benchmarks/capacity.py                       # calibrate and check (about 12 minutes on 2 cores)
  python benchmarks/capacity.py --write               # also write the costs `ovq plan` ships with
  python benchmarks/capacity.py --write mine.json     # costs of your machines: `ovq plan --costs mine.json`
  python benchmarks/capacity.py --from runs.json      # refit from points measured earlier (--out of a run)

CPU times are as noisy as the machine; counts are exact. Keep every point below the machine's saturation (on a
2-core box a tier's CPU per unit of work grows once the cores are shared out), or the fit learns the contention.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fleet_scale  # noqa: E402

from cli.capacity import COSTS_FILE, TIERS, Costs, Load, TierCosts, predict  # noqa: E402

CALIBRATE = "1:1:32:4,1:1:32:32,8:1:32:16,16:1:16:32,32:1:32:4,40:2:64:24,20:4:32:16,10:1:32:16:2,25:1:32:8:50"
CHECK = "10:1:32:16,50:1:32:16,100:1:32:16,50:1:32:16:20"
LOAD_TERMS = ("per_request_us", "per_token_us", "per_step_us", "per_tenant_request_us")


def points(spec: str) -> list[tuple[int, ...]]:
    """"N:A:C:T[:K],..." -> (workers, apis, streams, tokens, tenants) per point (K: 0, no tenants, when left out)."""
    return [(*(int(x) for x in p.split(":")), 0)[:5] for p in spec.split(",") if p]


def run(point: tuple[int, ...], args: argparse.Namespace) -> dict:
    workers, apis, streams, tokens, tenants = point
    ns = argparse.Namespace(apis=apis, per_host=args.per_host, profile=args.profile, seqs=args.seqs,
                            streams=streams, tokens=tokens, duration=args.duration, idle=args.idle,
                            settle=args.settle, tenants=tenants)
    m = fleet_scale.measure(workers, ns)
    m["streams"] = streams
    print(json.dumps({k: v for k, v in m.items() if k not in ("idle", "load")}), flush=True)
    return m


def observed(m: dict) -> tuple[Load, dict[str, float], dict[str, float]]:
    """The load a point offered, and each tier's CPU (cores) while idle and under it."""
    wall = m["wall"]
    load = Load(requests_per_s=m["jobs"] / wall, tokens_per_s=m["tokens"] / wall, streams=m["streams"],
                workers=m["workers"], apis=m["apis"], tenants=m.get("tenants", 0))
    idle = {tier: m["idle"][f"{tier}_cpu"] / m["idle"]["seconds"] for tier in TIERS}
    busy = {tier: m["load"][f"{tier}_cpu"] / m["load"]["seconds"] for tier in TIERS}
    return load, idle, busy


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a term that fits negative is dropped and the rest refit."""
    active = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[active] = np.linalg.lstsq(a[:, active], y, rcond=None)[0]
        negative = [i for i in active if x[i] < 0]
        if not negative:
            return x
        active.remove(min(negative, key=lambda i: x[i]))


def fit(measured: list[dict], note: str) -> Costs:
    rows = [observed(m) for m in measured]
    tiers = {}
    for tier in TIERS:
        idle_a = np.array([[load.workers, load.apis] for load, _, _ in rows], dtype=float)
        idle_x = nonnegative_lstsq(idle_a, np.array([idle[tier] for _, idle, _ in rows]))
        a = np.array([[load.requests_per_s, load.tokens_per_s, load.steps_per_s, load.tenant_requests_per_s]
                      for load, _, _ in rows])
        y = np.array([busy[tier] - (idle_x[0] * load.workers + idle_x[1] * load.apis) for load, _, busy in rows])
        x = nonnegative_lstsq(a, y)
        tiers[tier] = TierCosts(idle_per_worker_us=idle_x[0] * 1e6, idle_per_api_us=idle_x[1] * 1e6,
                                **{term: v * 1e6 for term, v in zip(LOAD_TERMS, x, strict=True)})
    return Costs(measured=note, **tiers)


def check(costs: Costs, measured: list[dict]) -> tuple[str, float]:
    lines = ["| workers | APIs | tenants | streams | tokens | req/s | tok/s | tier | measured cores | predicted cores "
             "| error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for m in measured:
        load, _, busy = observed(m)
        predicted = predict(load, costs)
        for tier in TIERS:
            error = (predicted[tier] - busy[tier]) / busy[tier] * 100
            worst = max(worst, abs(error))
            lines.append(f"| {load.workers} | {load.apis} | {load.tenants} | {load.streams} | "
                         f"{m['tokens'] // max(m['jobs'], 1)} | "
                         f"{load.requests_per_s:.1f} | {load.tokens_per_s:.0f} | {tier} | {busy[tier]:.3f} | "
                         f"{predicted[tier]:.3f} | {error:+.0f} % |")
    return "\n".join(lines), worst


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrate", default=CALIBRATE, help="points N:A:C:T[:K] (workers, APIs, streams, "
                        "tokens, tenants)")
    parser.add_argument("--check", default=CHECK, help="points the fitted model is checked at")
    parser.add_argument("--per-host", type=int, default=25)
    parser.add_argument("--profile", default="smollm2")
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=6.0)
    parser.add_argument("--from", dest="source", type=Path, help="refit from the points of an earlier --out")
    parser.add_argument("--out", type=Path, help="write every point measured (JSON)")
    parser.add_argument("--write", type=Path, nargs="?", const=COSTS_FILE, metavar="COSTS.json",
                        help=f"write the fitted costs there (`ovq plan --costs`); alone: to {COSTS_FILE}, the ones "
                        "ovq ships")
    args = parser.parse_args()
    if args.source:
        data = json.loads(args.source.read_text())
        calibration, checks = data["calibrate"], data["check"]
    else:
        calibration = [run(p, args) for p in points(args.calibrate)]
        checks = [run(p, args) for p in points(args.check)]
        if args.out:
            args.out.write_text(json.dumps({"calibrate": calibration, "check": checks}, indent=1))
    where = f"refit from {args.source}" if args.source else f"at {commit()} on {time.strftime('%Y-%m-%d')}"
    spec = ",".join(":".join(str(m[k]) for k in ("workers", "apis", "streams")) + f":{m['tokens'] // max(m['jobs'], 1)}"
                    + (f":{m['tenants']}" if m.get("tenants") else "") for m in calibration)
    note = (f"benchmarks/capacity.py {where}: {len(calibration)} calibration points ({spec}), simulated "
            f"'{args.profile}' engines")
    costs = fit(calibration, note)
    print(costs.model_dump_json(indent=1))
    table, worst = check(costs, checks)
    print(table)
    print(f"worst error at the check points: {worst:.0f} %")
    if args.write:
        args.write.write_text(costs.model_dump_json(indent=1) + "\n")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
