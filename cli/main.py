"""`ovq serve | api | worker | models prepare`."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.config import configured_models
from common.redis_server import EmbeddedRedis
from common.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {"config": Path(args.config)} if getattr(args, "config", None) else {}
    return Settings(**overrides)


def _env(settings: Settings, redis_url: str | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if redis_url:
        env["REDIS_URL"] = redis_url
    if settings.config:
        env["OVQ_CONFIG"] = str(settings.config)
    env.update(extra)
    return env


def _module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, *args]


def _child(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Its own session, so a Ctrl-C reaches only `ovq serve`, which stops the tiers in order: API, workers, Redis.
    return subprocess.Popen(args, env=env, start_new_session=True)


def serve(args: argparse.Namespace) -> int:
    """Everything on one machine: embedded Redis (unless REDIS_URL), a worker per model and device, the API."""
    if args.host:
        os.environ["OVQ_HOST"] = args.host
    if args.port:
        os.environ["OVQ_PORT"] = str(args.port)
    settings = _settings(args)
    from workers.prepare import prepare

    models = configured_models(settings)
    for model in models:
        prepare(model)
    redis = None if settings.redis_url else EmbeddedRedis(settings.cache_dir / "redis")
    url = redis.start() if redis else settings.redis_url
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        for model in models:
            for device in model.devices:
                args = _module("workers", "--model", model.name, "--device", device)
                children.append(_child(args, _env(settings, url)))
        api_env = _env(settings, url, OVQ_MODELS=json.dumps([m.name for m in models]))
        children.append(_child(_module("api"), api_env))
        print(f"ovq: serving {', '.join(m.name for m in models)} on http://{settings.host}:{settings.port}/v3 "
              f"(Redis: {'embedded' if redis else url}); Ctrl-C stops", file=sys.stderr)
        while not stopping:
            if any(child.poll() is not None for child in children):
                print("ovq: a process exited; stopping the rest", file=sys.stderr)
                break
            time.sleep(0.2)
    finally:
        for child in reversed(children):  # the API first, so no new jobs arrive while workers drain
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(timeout=settings.shutdown_grace_s + 5)
            except subprocess.TimeoutExpired:
                child.kill()
        if redis:
            redis.stop()
    return 0 if stopping else 1


def api(args: argparse.Namespace) -> int:
    settings = _settings(args)
    env = _env(settings, None)
    if args.host:
        env["OVQ_HOST"] = args.host
    if args.port:
        env["OVQ_PORT"] = str(args.port)
    return subprocess.call(_module("api"), env=env)


def worker(args: argparse.Namespace) -> int:
    config = ["--config", args.config] if args.config else []
    return subprocess.call(_module("workers", "--model", args.model, "--device", args.device, *config))


def prepare_models(args: argparse.Namespace) -> int:
    from workers.prepare import prepare

    settings = _settings(args)
    for model in configured_models(settings):
        if args.model in (None, model.name):
            print(f"{model.name}: {prepare(model)}")
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="ovq", description="Queue-based OpenAI API serving for OpenVINO GenAI")
    sub = root.add_subparsers(dest="command", required=True)
    for name, func, help_text in (("serve", serve, "embedded Redis + workers + API on one machine"),
                                  ("api", api, "the HTTP API only")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", help="models file (YAML or JSON)")
        p.add_argument("--host")
        p.add_argument("--port", type=int)
        p.set_defaults(func=func)
    p = sub.add_parser("worker", help="one worker: a model on a device")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="CPU")
    p.add_argument("--config")
    p.set_defaults(func=worker)
    models = sub.add_parser("models", help="model management").add_subparsers(dest="action", required=True)
    p = models.add_parser("prepare", help="download and convert models to OpenVINO IR")
    p.add_argument("--config")
    p.add_argument("--model")
    p.set_defaults(func=prepare_models)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
