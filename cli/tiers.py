"""`ovq api` and `ovq worker`: the command becomes the tier (exec), so signals reach it directly.

As PID 1 of a container, or under a Procfile runner, SIGTERM then drains the tier itself: no wrapper process
that ignores it, orphans a worker or kills one mid-job.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from cli import exposure, ovms
from common.settings import Settings


def _exec(module: str, args: list[str], env: dict[str, str]) -> int:
    os.environ.update(env)
    if ovms.checked_models(Settings(), "ovq") is None:  # one line here rather than a tier's traceback
        return 2
    os.execvpe(sys.executable, [sys.executable, "-m", module, *args], {**os.environ, **env})
    return 1  # not reached


def config_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if getattr(args, "config", None):
        env["OVQ_CONFIG"] = os.path.abspath(args.config)
    env.update(ovms.env(args))
    return env


def key_env(args: argparse.Namespace) -> dict[str, str]:
    """Keys travel to the API in its environment, never on a command line another user's `ps` shows."""
    env = {}
    for option, name in (("api_key", "OVQ_API_KEYS"), ("admin_key", "OVQ_ADMIN_KEYS")):
        if getattr(args, option, None):
            env[name] = json.dumps(getattr(args, option))
    for option, name in (("api_key_file", "OVQ_API_KEY_FILE"), ("admin_key_file", "OVQ_ADMIN_KEY_FILE")):
        if getattr(args, option, None):
            env[name] = os.path.abspath(getattr(args, option))
    return env


def api_env(args: argparse.Namespace) -> dict[str, str]:
    """What `add_api_arguments`' options carry to the API (and to the tiers `ovq serve` starts beside it), but
    the keys (`key_env`: for the API only)."""
    env = config_env(args)
    for option, name in (("host", "OVQ_HOST"), ("port", "OVQ_PORT"), ("processes", "OVQ_API_PROCESSES")):
        if getattr(args, option, None):
            env[name] = str(getattr(args, option))
    return env


def add_api_arguments(p: argparse.ArgumentParser, processes: str = "--processes") -> None:
    """The API's options, the same for `ovq api` and `ovq serve` (which names `processes` `--api-processes`)."""
    p.add_argument("--config", help="models file (YAML or JSON)")
    p.add_argument("--host", help="the address the API binds (OVQ_HOST; other than loopback needs an API key)")
    p.add_argument("--port", type=int, help="the API's HTTP port (OVQ_PORT)")
    p.add_argument(processes, dest="processes", type=int,
                   help="API processes sharing the port (default: OVQ_API_PROCESSES)")
    ovms.add_arguments(p, server=True)
    add_key_arguments(p)
    exposure.add_argument(p)


def add_key_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", action="append", metavar="KEY",
                   help="a key clients must send as `Authorization: Bearer KEY` (repeatable; OVQ_API_KEYS)")
    p.add_argument("--api-key-file", metavar="PATH", help="API keys, one per line (OVMS's --api_key_file)")
    p.add_argument("--admin-key", action="append", metavar="KEY",
                   help="a key for /metrics, /docs, /openapi.json and /ops (repeatable; OVQ_ADMIN_KEYS)")
    p.add_argument("--admin-key-file", metavar="PATH", help="admin keys, one per line")


def api(args: argparse.Namespace) -> int:
    return _exec("api", [], {**api_env(args), **key_env(args), **exposure.env(args)})


def worker(args: argparse.Namespace) -> int:
    if bool(args.model) == bool(args.pool):
        print("ovq worker: give --model NAME, or --pool (or an action: ovq worker drain ID)", file=sys.stderr)
        return 2
    env = config_env(args)
    if args.memory_mb:
        env["OVQ_POOL_MEMORY_MB"] = str(args.memory_mb)
    serves = ["--pool"] if args.pool else ["--model", args.model]
    return _exec("workers", [*serves, "--device", args.device], env)


def add_parsers(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`ovq api` and `ovq worker`; returns the worker's parser (its actions, like drain, live elsewhere)."""
    p = sub.add_parser("api", help="the HTTP API (any number, on any hosts)")
    add_api_arguments(p)
    p.set_defaults(func=api)
    p = sub.add_parser("worker", help="one worker: a model on a device, or a pool (or: ovq worker drain ID)")
    p.add_argument("--model", help="the model to serve (a dedicated worker)")
    p.add_argument("--pool", action="store_true",
                   help="a pool worker: serves any model of the models file, loading those with waiting work")
    p.add_argument("--memory-mb", type=int, help="a pool worker's memory budget for its models (OVQ_POOL_MEMORY_MB)")
    p.add_argument("--device", default="CPU", help="the device the worker runs its model on")
    p.add_argument("--config", help="models file (YAML or JSON)")
    ovms.add_arguments(p)
    p.set_defaults(func=worker)
    return p
