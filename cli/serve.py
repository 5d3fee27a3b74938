"""`ovq serve`: everything on one machine: embedded Redis (unless REDIS_URL), a worker per model and device, the API,
and a batch worker (the Batch API).

A child that dies is restarted (with backoff); Ctrl-C or SIGTERM stops the batch worker (its batch goes back on the
queue), then the API (no new jobs), then the workers (they drain), then Redis.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from api.http.auth import KeyFileError, read_key_file
from cli import ovms
from cli.tiers import add_api_arguments, api_env, key_env
from common.redis.client import embedded_socket
from common.redis.server import EmbeddedRedis
from common.settings import Settings

# A child that exits sooner than this after starting counts as failing to start; after MAX_QUICK_EXITS in a row
# it is given up on (a configuration error restarted forever helps nobody).
QUICK_EXIT_S = 10.0
MAX_QUICK_EXITS = 5


def log(message: str) -> None:
    print(f"ovq serve: {message}", file=sys.stderr, flush=True)


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_exits: int = 0
    restart_at: float | None = None
    given_up: bool = False
    delays: list[float] = field(default_factory=list)

    def start(self) -> None:
        # Its own session, so a Ctrl-C reaches only `ovq serve`, which stops the tiers in order.
        self.process = subprocess.Popen(self.args, env=self.env, start_new_session=True)
        self.started = time.monotonic()
        self.restart_at = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """Restart the child if it exited, after a backoff; give up on one that keeps failing to start."""
        now = time.monotonic()
        if self.given_up or self.running:
            return
        if self.restart_at is None:
            code = self.process.returncode if self.process else None
            self.quick_exits = self.quick_exits + 1 if now - self.started < QUICK_EXIT_S else 0
            if self.quick_exits >= MAX_QUICK_EXITS:
                self.given_up = True
                log(f"{self.name} exited with code {code} {MAX_QUICK_EXITS} times in a row right after starting; "
                    "not restarting it")
                return
            delay = min(2.0 ** self.quick_exits, 30.0)
            log(f"{self.name} exited with code {code}; restarting it in {delay:.0f}s")
            self.restart_at = now + delay
        elif now >= self.restart_at:
            self.start()

    def stop(self, timeout: float) -> None:
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop within {timeout:.0f}s; killing it")
            self.process.kill()
            self.process.wait()


def _module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, *args]


def _check_key_files(env: dict[str, str]) -> None:
    """A key file the API cannot read would make it exit at once, again and again: say so before starting."""
    for name in ("OVQ_API_KEY_FILE", "OVQ_ADMIN_KEY_FILE"):
        if env.get(name):
            read_key_file(Path(env[name]))


def _batch_key(env: dict[str, str], keys: dict[str, str]) -> dict[str, str]:
    """The batch worker calls this stack's API: with API keys on, it sends the first one."""
    merged = {**env, **keys}
    if merged.get("OVQ_BATCH_API_KEY"):
        return {}
    key_file = merged.get("OVQ_API_KEY_FILE")
    found = [k.get_secret_value() for k in Settings(api_keys=merged.get("OVQ_API_KEYS", [])).api_keys]
    found += read_key_file(Path(key_file)) if key_file else []
    return {"OVQ_BATCH_API_KEY": found[0]} if found else {}


def serve(args: argparse.Namespace) -> int:
    env = {**os.environ, **api_env(args)}
    keys = key_env(args)  # for the API only: workers never see a key
    os.environ.update(env)
    settings = Settings()
    try:
        _check_key_files({**env, **keys})
    except KeyFileError as exc:
        log(str(exc))
        return 2
    from common.models.prepare import prepare

    models = ovms.checked_models(settings, "ovq serve")
    if models is None:
        return 2
    for model in models:
        prepare(model)
    redis = None
    if not settings.redis_url:
        redis = EmbeddedRedis(embedded_socket(settings).parent)
        try:
            env["REDIS_URL"] = redis.start()
        except RuntimeError as exc:
            log(str(exc))
            return 1
    workers = [Child(f"worker {m.name} on {d}", _module("workers", "--model", m.name, "--device", d), env)
               for m in models for d in m.devices]
    api = Child("api", _module("api"), {**env, **keys, "OVQ_MODELS": json.dumps([m.name for m in models])})
    # Lines go to this API (OVQ_PORT), with one of its keys.
    batch = Child("batch worker", _module("cli.main", "batch-worker"), {**env, **_batch_key(env, keys)})
    stopping: list[str] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    children = [*workers, api, batch]
    try:
        for child in children:
            child.start()
        log(f"serving {', '.join(m.name for m in models)} on http://{settings.host}:{settings.port}/v3 "
            f"(Redis: {'embedded, ' + str(embedded_socket(settings)) if redis else settings.redis_url}); "
            "Ctrl-C stops")
        while not stopping and not all(c.given_up for c in children):
            for child in children:
                child.check()
            time.sleep(0.2)
    finally:
        why = stopping[0] if stopping else "every child failed"
        log(f"{why}: stopping the batch worker and the API, then the workers "
            f"(grace {settings.shutdown_grace_s:.0f}s), then Redis")
        batch.stop(settings.shutdown_grace_s + 10)  # first: its lines in flight need the API and the workers
        api.stop(settings.shutdown_grace_s + 10)
        for child in workers:  # all at once: each drains its own jobs within the grace period
            if child.running:
                child.process.send_signal(signal.SIGTERM)
        for child in workers:
            child.stop(settings.shutdown_grace_s + 10)
        if redis:
            redis.stop()
    return 0 if stopping else 1


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="embedded Redis + a worker per model and device + the API, on one machine")
    add_api_arguments(p, processes="--api-processes")
    p.set_defaults(func=serve)
