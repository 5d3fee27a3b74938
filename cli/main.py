"""`ovq`: wires the command groups; each lives in its own module."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from importlib.metadata import PackageNotFoundError, version


def _stopped(signum: int, _frame: object) -> None:
    print(f"ovq: {signal.Signals(signum).name} before the command started: exiting", file=sys.stderr, flush=True)
    # Not sys.exit: the handler can run inside any import, and a SystemExit raised in a class body's __set_name__
    # (CI: rich's dataclasses) comes out as a RuntimeError with a traceback and exit 1. Nothing is started yet.
    os._exit(0)


# Before the imports below (a second or more): a stop signal while `ovq` starts ends it with exit 0 and a line, not
# a kill. Each command puts its own handlers in place when it has any; `ovq api` and `ovq worker` exec the tier.
signal.signal(signal.SIGTERM, _stopped)

from cli import batch, dead, drain, jobs, models, plan, redis, serve, status, tiers, webhooks  # noqa: E402


def _version() -> str:
    """The installed distribution's version: pyproject.toml's `version`, the one place it is written."""
    try:
        return version("ovq")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="ovq", description="Queue-based OpenAI API serving for OpenVINO GenAI")
    root.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = root.add_subparsers(dest="command", required=True)
    serve.add_parsers(sub)
    drain.add_parsers(tiers.add_parsers(sub))
    redis.add_parsers(sub)
    models.add_parsers(sub)
    batch.add_parsers(sub)
    status.add_parsers(sub)
    jobs.add_parsers(sub)
    dead.add_parsers(sub)
    webhooks.add_parsers(sub)
    plan.add_parsers(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
