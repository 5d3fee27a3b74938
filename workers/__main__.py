"""`python -m workers --model NAME --device CPU`: one worker process for one model on one device."""
from __future__ import annotations

import argparse
import logging
import sys

import uvloop

from common.config import find_model
from common.settings import Settings
from workers.prepare import prepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ovq worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--config", default=None, help="models file (YAML or JSON)")
    args = parser.parse_args(argv)
    overrides = {"config": args.config} if args.config else {}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        model = find_model(settings, args.model)
    except KeyError:
        print(f"ovq worker: no model named {args.model!r} in the models file", file=sys.stderr)
        return 2
    prepare(model)
    from workers.worker import Worker

    try:
        uvloop.run(Worker(settings, model, args.device.upper()).run())
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        print(f"ovq worker: device {args.device} unavailable for {model.name}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
