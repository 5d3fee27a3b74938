#!/usr/bin/env python3
"""Chaos on the containerized fleet (issue 38, item 4): deploy/compose.yaml's fleet under podman-compose with
Sentinel-backed Redis (benchmarks/chaos/fleet.py), a mixed workload through both APIs (chaos/workload.py), a fault
every `--period` seconds in turn: a worker SIGKILL, an API SIGKILL, the Redis primary killed (Sentinel failover), a
worker cut off from the network for longer than the worker TTL, a worker over its memory limit (chaos/faults.py).
Then the checker (chaos/checker.py) proves, for every request, one terminal outcome, what the client received equal
to what the server recorded, no event number twice or missing, greedy text equal to its reference where sound, no
leaked Redis key and no idle worker holding KV cache, and prints the table. Exit code 1 when it finds a problem.

    python benchmarks/chaos.py --minutes 3                 # needs podman, podman-compose and the image ovq:0.1.0
    python benchmarks/chaos.py --minutes 60 --image localhost/ovq:test --records run.json
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chaos import checker, fleet, server, table  # noqa: E402
from benchmarks.chaos.client import Client  # noqa: E402
from benchmarks.chaos.faults import schedule  # noqa: E402
from benchmarks.chaos.records import EMBEDDING, Run  # noqa: E402
from benchmarks.chaos.workload import Mix, Workload, references  # noqa: E402

DRAIN_S = 900.0  # the workload's last round, after the last fault
TIMEOUT = httpx.Timeout(connect=10, read=360, write=30, pool=30)  # read: above OVQ_QUEUE_TIMEOUT_S (300 s)


async def _progress(workload: Workload, run: Run) -> None:
    while True:
        await asyncio.sleep(60)
        print(f"chaos: +{time.time() - run.began:.0f} s: {workload.progress()}; faults: "
              f"{', '.join(f.kind for f in run.faults)}", flush=True)


async def _exercise(f: fleet.Fleet, minutes: float, period_s: float, run: Run) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=httpx.Limits(max_connections=200)) as http:
        c = Client(f.apis, f.key, http)
        mix = Mix()
        texts, vectors = await references(c, mix)
        r = server.connect(f)
        run.baseline = server.snapshot(r)
        workload = Workload(c, mix, texts)
        run.began = time.time()
        until = run.began + minutes * 60
        ticker = asyncio.create_task(_progress(workload, run))
        await asyncio.gather(asyncio.wait_for(workload.run(until), minutes * 60 + DRAIN_S),
                             schedule(f, until, period_s, run.faults), return_exceptions=True)
        ticker.cancel()
        run.finished = time.time()
        run.requests, run.harness_statuses = workload.requests, workload.harness_statuses
        for request in run.requests:
            if request.kind == EMBEDDING:
                request.reference_vector = vectors.get(request.prompt)
        await server.stored_responses(c, run.requests, run.harness_statuses)
    r = server.connect(f)
    server.job_texts(r, run.requests)
    run.kv_usage = server.idle_kv_usage(f)
    server.expire_run_keys(r, run.baseline)
    run.after = server.snapshot(r)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--period", type=float, default=30.0, help="seconds from one fault to the next")
    parser.add_argument("--image", default="ovq:0.1.0")
    parser.add_argument("--records", type=Path, help="write every request and fault here (JSON)")
    parser.add_argument("--keep", action="store_true", help="leave the fleet running")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr] - progress lines as they come, in a log too
    directory = Path(tempfile.mkdtemp(prefix="ovq-chaos-"))
    started = time.time()
    f = fleet.up(directory, args.image)
    print(f"chaos: fleet up in {time.time() - started:.0f} s ({directory})", flush=True)
    run = Run([], [], apis=dict(zip(f.apis, f.api_containers, strict=True)))
    try:
        asyncio.run(_exercise(f, args.minutes, args.period, run))
    finally:
        if args.records:
            args.records.write_text(json.dumps(dataclasses.asdict(run), default=str))
        if not args.keep:
            fleet.down(directory)
    report = checker.check(run, keep={fleet.LLM, fleet.EMBED})
    print(table.render(report, args.minutes))
    for fault in run.faults:
        print(f"chaos: fault {fault.kind} on {fault.target or '?'} at +{fault.began - run.began:.0f} s, "
              f"recovered in {fault.ended - fault.began:.0f} s {fault.note}")
    if report.failed:
        print(table.problems(report))
    print(f"chaos: {'FAILED' if report.failed else 'passed'} in {time.time() - started:.0f} s")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
