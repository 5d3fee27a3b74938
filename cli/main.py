"""`ovq`: wires the command groups; each lives in its own module."""
from __future__ import annotations

import argparse
import sys

from cli import batch, dead, drain, jobs, models, redis, serve, status, tiers


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="ovq", description="Queue-based OpenAI API serving for OpenVINO GenAI")
    sub = root.add_subparsers(dest="command", required=True)
    serve.add_parsers(sub)
    drain.add_parsers(tiers.add_parsers(sub))
    redis.add_parsers(sub)
    models.add_parsers(sub)
    batch.add_parsers(sub)
    status.add_parsers(sub)
    jobs.add_parsers(sub)
    dead.add_parsers(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
