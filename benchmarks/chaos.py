#!/usr/bin/env python3
"""Chaos on the containerized fleet (issue 38, item 4): deploy/compose.yaml's fleet under podman-compose with
Sentinel-backed Redis (benchmarks/chaos/fleet.py), a mixed workload through both APIs (chaos/workload.py), a fault
every `--period` seconds in turn: the Redis primary killed (Sentinel failover), an API SIGKILL, a worker cut off from
the network for longer than the worker TTL, a worker over its memory limit, a worker SIGKILL (chaos/faults.py).
Then the checker (chaos/checker.py) proves, for every request, one terminal outcome, what the client received equal
to what the server recorded, no event number twice or missing, greedy text equal to its reference where sound, no
leaked Redis key and no idle worker holding KV cache, and prints the table. Exit code 1 when it finds a problem.

Everything the run leaves is under `--out` (a new directory by default): the derived compose file, `records.json`
(every request and fault as recorded), `logs/` (every container's log), `table.md`.

    python benchmarks/chaos.py --minutes 3                 # needs podman, podman-compose and the image ovq:0.1.0
    python benchmarks/chaos.py --minutes 60 --image localhost/ovq:test --out /var/tmp/chaos-60
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chaos import checker, faults, fleet, records, server, table  # noqa: E402
from benchmarks.chaos.client import Client  # noqa: E402
from benchmarks.chaos.records import EMBEDDING, Run  # noqa: E402
from benchmarks.chaos.workload import Mix, Workload, references  # noqa: E402

DRAIN_S = 900.0  # the workload's last round, after the last fault
TIMEOUT = httpx.Timeout(connect=10, read=360, write=30, pool=30)  # read: above OVQ_QUEUE_TIMEOUT_S (300 s)
READ_BACK_S = 60.0
SETTLED_S = 5.0  # a job's record is final when its terminal event is out; a margin for a takeover's last write


async def _progress(workload: Workload, run: Run) -> None:
    while True:
        await asyncio.sleep(60)
        print(f"chaos: +{time.time() - run.began:.0f} s: {workload.progress()}; faults: "
              f"{', '.join(f.kind for f in run.faults)}", flush=True)


async def _read_back(f: fleet.Fleet, run: Run) -> None:
    """Every READ_BACK_S, the server's records of the requests that ended meanwhile (`server.read_back`); a round
    that finds Redis failing over is tried again at the next."""
    while True:
        await asyncio.sleep(READ_BACK_S)
        try:
            await asyncio.to_thread(lambda: server.read_back(server.connect(f), run.requests, SETTLED_S))
        except Exception as exc:  # noqa: BLE001 - a fault under way (no primary, a connection lost): next round
            print(f"chaos: reading the server's records back failed ({exc!r}); again in {READ_BACK_S:.0f} s")


async def _exercise(f: fleet.Fleet, args: argparse.Namespace, run: Run) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=httpx.Limits(max_connections=200)) as http:
        c = Client(f.apis, f.key, http)
        mix = Mix()
        texts, vectors = await references(c, mix)
        run.baseline = server.snapshot(server.connect(f))
        workload = Workload(c, mix, texts)
        workload.requests, workload.harness_statuses = run.requests, run.harness_statuses  # recorded even on a crash
        run.began = time.time()
        until = run.began + args.minutes * 60
        ticker = asyncio.create_task(_progress(workload, run))
        reader = asyncio.create_task(_read_back(f, run))
        every_kind, kinds = asyncio.Event(), tuple(args.faults.split(","))
        bound = args.minutes * 60 + len(kinds) * faults.RECOVERY_S + DRAIN_S
        for outcome in await asyncio.gather(asyncio.wait_for(workload.run(until, every_kind), bound),
                                            faults.schedule(f, until, args.period, run.faults, kinds, every_kind),
                                            return_exceptions=True):
            if isinstance(outcome, BaseException):
                print(f"chaos: the workload or the faults stopped early: {outcome!r}", flush=True)
        ticker.cancel()
        reader.cancel()
        run.finished = time.time()
        for request in run.requests:
            if request.kind == EMBEDDING:
                request.reference_vector = vectors.get(request.prompt)
        await server.stored_responses(c, run.requests, run.harness_statuses)


def _afterwards(f: fleet.Fleet, run: Run) -> None:
    """What the server recorded, each idle worker's KV cache, and Redis once the run's expiring keys are gone."""
    faults.all_ready(f)
    r = server.connect(f)
    server.read_back(r, run.requests)  # those not read during the run
    run.kv_usage = server.idle_kv_usage(f)
    assert run.baseline is not None
    server.expire_run_keys(r, run.baseline)
    run.after = server.snapshot(r)


def _report(run: Run, out: Path) -> int:
    report = checker.check(run, keep={fleet.LLM, fleet.EMBED})
    lines = [table.render(report, (run.finished - run.began) / 60)]
    lines += [f"fault {f.kind} on {f.target or '?'} at +{f.began - run.began:.0f} s, recovered in "
              f"{f.ended - f.began:.0f} s {f.note}" for f in run.faults]
    if report.failed:
        lines.append(table.problems(report))
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 1 if report.failed else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--period", type=float, default=30.0, help="seconds from one fault to the next")
    parser.add_argument("--faults", default=",".join(faults.KINDS), help="the kinds, in turn (comma-separated)")
    parser.add_argument("--image", default="ovq:0.1.0")
    parser.add_argument("--out", type=Path, help="where the run's files go (default: a new directory)")
    parser.add_argument("--keep", action="store_true", help="leave the fleet running")
    parser.add_argument("--check", type=Path, metavar="RECORDS",
                        help="no run: check a run's records.json again and print its table")
    args = parser.parse_args(argv)
    if args.check:
        args.out = args.check.parent
        return _report(records.load(args.check), args.out)
    unknown = set(args.faults.split(",")) - set(faults.KINDS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; the kinds are {', '.join(faults.KINDS)}")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr] - progress lines as they come, in a log too
    args.out = args.out or Path(tempfile.mkdtemp(prefix="ovq-chaos-"))
    args.out.mkdir(parents=True, exist_ok=True)
    started, directory = time.time(), args.out / "fleet"
    f = fleet.up(directory, args.image)
    print(f"chaos: fleet up in {time.time() - started:.0f} s; the run's files: {args.out}", flush=True)
    run = Run([], [], apis=dict(zip(f.apis, f.api_containers, strict=True)))
    try:
        asyncio.run(_exercise(f, args, run))
        _afterwards(f, run)
    finally:
        records.save(run, args.out / "records.json")
        fleet.save_logs(args.out)
        if not args.keep:
            fleet.down(directory)
    code = _report(run, args.out)
    print(f"chaos: {'FAILED' if code else 'passed'} in {time.time() - started:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
