"""`ovq jobs show ID`: where a job is and how it went: model, device, worker, API process, status, timings, error.
`ovq jobs background` lists the background responses, `ovq jobs cancel RESP_ID` cancels one; `ovq jobs batches` and
`ovq jobs files` list the Batch API's batches and files. Every list says whose each object is (its owner tenant)."""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel
from rich.table import Table

from cli.console import console, error, print_json, run
from common.keys import Keys
from common.ops import control, owned
from common.settings import Settings


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def rows(info: control.JobInfo) -> list[tuple[str, str]]:
    alive = {True: "alive", False: "gone", None: "never announced"}[info.api_alive]
    out = [("job", info.id), ("status", info.status), ("model", info.model or "-"), ("device", info.device or "-"),
           ("kind", info.kind or "-"), ("worker", info.worker or "-"),
           ("API process", f"{info.api} ({alive})" if info.api else "-"),
           ("created", _when(info.created)), ("updated", _when(info.updated)),
           ("queue", _ms(info.queue_ms)), ("time to first token", _ms(info.ttft_ms)), ("total", _ms(info.total_ms)),
           ("prompt tokens", str(info.prompt_tokens) if info.prompt_tokens is not None else "-"),
           ("completion tokens", str(info.completion_tokens) if info.completion_tokens is not None else "-")]
    if info.finish_reasons:
        out.append(("finish reasons", ", ".join(info.finish_reasons)))
    if info.deliveries is not None:
        out.append(("deliveries", str(info.deliveries)))
    if info.retries:
        out.append(("retried", f"{info.retries} times from the dead letters"))
    if info.reason:
        out.append(("reason", info.reason))
    if info.error:
        out.append(("error", f"{info.error.get('type', '')}: {info.error.get('message', '')}"))
    if info.text is not None:
        out.append(("text", info.text))
    return out


async def _show(redis: aioredis.Redis, keys: Keys, settings: Settings, job_id: str, as_json: bool) -> int:
    try:
        info = await control.job_info(redis, keys, settings, job_id)
    except control.NotFound as exc:
        error(str(exc))
        return 1
    if as_json:
        print_json(info.model_dump(mode="json"))
        return 0
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in rows(info):
        table.add_row(name, value)
    console().print(table)
    return 0


def show(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _show(redis, keys, settings, args.id, args.json))


def _listing(listed: Sequence[BaseModel], as_json: bool, columns: tuple[str, ...],
             row: Callable[[Any], tuple[str, ...]], empty: str) -> int:
    """Stored objects with their owners: JSON, or a table (one `row` each)."""
    if as_json:
        print_json([item.model_dump(mode="json") for item in listed])
        return 0
    table = Table(box=None)
    for column in columns:
        table.add_column(column)
    for item in listed:
        table.add_row(*row(item))
    console().print(table if listed else empty)
    return 0


async def _backgrounds(redis: aioredis.Redis, keys: Keys, as_json: bool) -> int:
    return _listing(await control.background_responses(redis, keys, limit=100), as_json,
                    ("response", "owner", "created", "model", "job", "status"),
                    lambda b: (b.id, b.owner, _when(b.created), b.model, b.job, b.status), "no background responses")


async def _batches(redis: aioredis.Redis, keys: Keys, settings: Settings, as_json: bool) -> int:
    return _listing(await owned.batches(redis, keys, settings, limit=100), as_json,
                    ("batch", "owner", "created", "model", "status", "lines done / failed / total"),
                    lambda b: (b.id, b.owner, _when(b.created), b.model or "-", b.status,
                               f"{b.completed} / {b.failed} / {b.total}"), "no batches")


async def _files(redis: aioredis.Redis, keys: Keys, settings: Settings, as_json: bool) -> int:
    return _listing(await owned.files(redis, keys, settings, limit=100), as_json,
                    ("file", "owner", "created", "purpose", "bytes", "filename"),
                    lambda f: (f.id, f.owner, _when(f.created), f.purpose, str(f.bytes), f.filename), "no files")


async def _cancel(redis: aioredis.Redis, keys: Keys, settings: Settings, response_id: str) -> int:
    try:
        job = await control.cancel_background(redis, keys, settings, response_id)
    except (control.NotFound, control.Refused) as exc:
        error(str(exc))
        return 1
    console().print(f"background response {response_id} cancelled (job {job})")
    return 0


def backgrounds(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _backgrounds(redis, keys, args.json))


def batches(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _batches(redis, keys, settings, args.json))


def files(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _files(redis, keys, settings, args.json))


def cancel(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _cancel(redis, keys, settings, args.id))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="look jobs up")
    actions = p.add_subparsers(dest="jobs_command", required=True)
    s = actions.add_parser("show", help="a job's model, device, worker, API process, status, timings and error")
    s.add_argument("id", help="the job id (the API's X-Request-Id)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=show)
    b = actions.add_parser("background", help="the background responses (/v1/responses with background: true) "
                           "and their status: queued, running, done, error, cancelled")
    b.add_argument("--json", action="store_true", help="print JSON instead of a table")
    b.set_defaults(func=backgrounds)
    for name, func, what in (("batches", batches, "the Batch API's batches"), ("files", files, "the stored files")):
        listing = actions.add_parser(name, help=f"{what}, every tenant's, with whose each is")
        listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
        listing.set_defaults(func=func)
    c = actions.add_parser("cancel", help="cancel a background response (by its resp_... id)")
    c.add_argument("id", help="the response id")
    c.set_defaults(func=cancel)
