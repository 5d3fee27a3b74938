"""`ovq serve`: everything on one machine: embedded Redis (unless REDIS_URL), a worker per model and device, the API,
and a batch worker (the Batch API).

It says "serving" only once the API answers and every worker has announced itself (cli/readiness.py), showing
meanwhile which step it waits for (cli/progress.py). A worker or the API that exits or does not get there in time
while starting ends `ovq serve` (exit 1) with a line saying which and why. Once serving, a child that dies is
restarted (with backoff). Ctrl-C or SIGTERM, while starting too, stops the batch worker (its batch goes back on
the queue), then the API (no new jobs), then the workers (they drain), then Redis.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from api.http.auth import KeyFileError, read_key_file
from cli import exposure, ovms
from cli.progress import Progress, say
from cli.readiness import Announcements, api_answers, api_bound_s, local_url, worker_bound_s
from cli.tiers import add_api_arguments, api_env, key_env
from common.models.config import ModelConfig
from common.models.sources import has_models
from common.models.watch import ConfigWatch
from common.redis.client import RedisURLError, embedded_socket, keys_for, redis_url, sync_client
from common.redis.server import EmbeddedRedis
from common.settings import Settings

# A child that exits sooner than this after starting counts as failing to start; after MAX_QUICK_EXITS in a row
# it is given up on (a configuration error restarted forever helps nobody).
QUICK_EXIT_S = 10.0
MAX_QUICK_EXITS = 5
POLL_S = 0.25
# A child's line that says what went wrong: a log record at ERROR or worse, an exception, a tier's own one-line
# reason (`ovq worker: ...`). uvicorn, for one, logs more lines after its error as it shuts down.
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Error\b|Exception\b|^ovq [a-z-]+:")


def log(message: str) -> None:
    say(f"ovq serve: {message}")


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str]
    model: str = ""  # a worker's model and device, as it announces them
    device: str = ""
    process: subprocess.Popen[bytes] | None = None
    last_line: str = ""  # the last non-blank line it printed
    last_error: str = ""  # the last one that reads as an error: why it exited, most often
    reader: threading.Thread | None = None
    started: float = 0.0
    quick_exits: int = 0
    restart_at: float | None = None
    given_up: bool = False
    retired: bool = False  # its model (or device) left the models file: it drains and is not restarted
    delays: list[float] = field(default_factory=list)

    def start(self) -> None:
        # Its own session, so a Ctrl-C reaches only `ovq serve`, which stops the tiers in order.
        # Its lines pass through `ovq serve` (above the progress line, and remembered for a failure's reason),
        # unbuffered: in order, and none lost when it dies.
        self.process = subprocess.Popen(self.args, env={**self.env, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.last_line = self.last_error = ""
        self.started = time.monotonic()
        self.restart_at = None
        self.reader = threading.Thread(target=self._pass_on, args=(self.process.stdout,), daemon=True)
        self.reader.start()

    def _pass_on(self, lines: Iterable[bytes]) -> None:
        for raw in lines:
            line = raw.decode(errors="replace").rstrip()
            if line.strip():
                self.last_line = line.strip()
                if ERROR_LINE.search(line):
                    self.last_error = self.last_line
            try:
                say(line)
            except (OSError, ValueError):  # our stderr is gone (a closed pipe): keep reading, or the child blocks
                pass

    @property
    def last_words(self) -> str:
        return self.last_error or self.last_line

    def exit_reason(self) -> str:
        """How it exited, with its last error line, else its last line (read to the end first, but not for longer
        than a second: a grandchild may hold the pipe open)."""
        assert self.process is not None
        if self.reader is not None:
            self.reader.join(timeout=1.0)
        said = f": {self.last_words}" if self.last_words else ""
        return f"exited with code {self.process.returncode}{said}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """Restart the child if it exited, after a backoff; give up on one that keeps failing to start."""
        now = time.monotonic()
        if self.given_up or self.running or self.retired:
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
        """SIGTERM; killed past `timeout`."""
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
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


class Interrupted(BaseException):
    """SIGINT or SIGTERM while `ovq serve` works itself (preparing a model, starting Redis): like
    KeyboardInterrupt, no `except Exception` on the way catches it."""


class Stopper:
    """Records SIGINT and SIGTERM. Until the children start it also interrupts what `ovq serve` is doing itself;
    after, the loops see `why` and stop the tiers in order."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.interrupt = True

    def __call__(self, signum: int, _frame: object) -> None:
        self.why = self.why or signal.Signals(signum).name
        if self.interrupt:
            raise Interrupted(self.why)


def _prepare(model: ModelConfig) -> bool:
    """Download and convert the model, once (later starts find it prepared); False after a line saying why not."""
    from common.models.prepare import is_prepared, prepare

    if is_prepared(model.path):
        return True
    if model.source:
        # A plain line, not the progress spinner: the download and the conversion draw their own progress bars.
        log(f"preparing {model.name}: downloading it and converting it to OpenVINO IR, once, into {model.path}")
    try:
        prepare(model)
    except Exception as exc:  # a download or a conversion fails in many ways: one line, not a traceback
        log(f"{model.name} cannot be prepared: {exc}")
        return False
    return True


def _start_redis(redis: EmbeddedRedis, progress: Progress) -> str | None:
    progress.update(f"starting Redis (embedded, {redis.socket})")
    try:
        return redis.start()
    except RuntimeError as exc:
        log(str(exc))
        return None


def _forget_other_models(url: str, settings: Settings, models: list[ModelConfig]) -> None:
    """The embedded Redis is this user's alone and outlives a run: the cards of models an earlier run served with
    another models file would be listed (and wait for a worker that never comes) until the card TTL. This run serves
    its models file's models, no others."""
    keys = keys_for(settings)
    client = sync_client(url, socket_connect_timeout=settings.redis_timeout_s)
    try:
        keep = {m.name for m in models}
        gone = [m for m in (n.decode() for n in client.zrange(keys.models, 0, -1)) if m not in keep]
        if gone:
            client.zrem(keys.models, *gone)
            client.delete(*(keys.model(m) for m in gone))
            log(f"forgot {len(gone)} model(s) an earlier run served: {', '.join(sorted(gone))}")
    finally:
        client.close()


def _wait_until_serving(workers: list[Child], api: Child, batch: Child, stopper: Stopper, progress: Progress,
                        settings: Settings, url: str) -> str | None:
    """Wait, each tier within its bound, until the API answers and every worker has announced itself. None then
    (or when a signal came); else which tier did not start, and why."""
    base = local_url(settings.host, settings.port)
    announcements = Announcements(url, settings)
    started = time.monotonic()
    loading, api_up = list(workers), False
    try:
        while not stopper.why:
            batch.check()  # it needs the API only once lines come: restarted as ever meanwhile
            for child in [*workers, api]:
                if not child.running:
                    return f"{child.name} failed to start: {child.exit_reason()}"
            api_up = api_up or api_answers(base)
            loading = [w for w in loading if not announcements.announced(w.model, w.device, w.process.pid)]
            if api_up and not loading:
                return None
            late = [(w, worker_bound_s(settings), "announce itself") for w in loading]
            late += [] if api_up else [(api, api_bound_s(settings), f"answer {base}/health")]
            for child, bound, what in late:
                if time.monotonic() - child.started > bound:
                    said = f"; it last said: {child.last_words}" if child.last_words else ""
                    return f"{child.name} failed to start: it did not {what} within {bound:.0f}s{said}"
            steps = [f"loading {w.model} on {w.device}" for w in loading] + ([] if api_up else ["API starting"])
            progress.update(", ".join(steps), time.monotonic() - started)
            time.sleep(POLL_S)
        return None
    finally:
        announcements.close()


def _worker(model: ModelConfig, device: str, env: dict[str, str]) -> Child:
    return Child(f"worker {model.name} on {device}", _module("workers", "--model", model.name, "--device", device),
                 env, model=model.name, device=device.upper())


def _children(models: list[ModelConfig], env: dict[str, str],
              keys: dict[str, str]) -> tuple[list[Child], Child, Child]:
    """A worker per model and device, the API, the batch worker."""
    workers = [_worker(m, d, env) for m in models for d in m.devices]
    # With a models file the API follows it (its reloads too); the default model is named for it.
    named = {} if env.get("OVQ_CONFIG") or env.get("OVQ_OVMS_CONFIG") else {
        "OVQ_MODELS": json.dumps([m.name for m in models])}
    api = Child("api", _module("api"), {**env, **keys, **named})
    # Lines go to this API (OVQ_PORT), with one of its keys.
    batch = Child("batch worker", _module("cli.main", "batch-worker"), {**env, **_batch_key(env, keys)})
    return workers, api, batch


class Follow:
    """`ovq serve`'s side of a reload (docs/how-to/reload.md): a worker for each model and device the models file
    gained (prepared first), none restarted for one it lost (that worker drains and stops by itself); a changed
    model's workers restart their own engines."""

    def __init__(self, settings: Settings, url: str, env: dict[str, str], workers: list[Child]) -> None:
        self.settings, self.env, self.workers = settings, env, workers
        self.watch = ConfigWatch(settings)
        self.keys = keys_for(settings)
        self.client = sync_client(url, socket_connect_timeout=settings.redis_timeout_s,
                                  socket_timeout=settings.redis_timeout_s)
        self.next_at = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.settings.config_poll_s
        try:
            value = int(self.client.get(self.keys.config_generation) or 0)
        except Exception:  # Redis away: the file's stat still counts
            value = None
        force = self.watch.heard(value)
        if self.watch.poll(force):
            self.apply()

    def apply(self) -> None:
        wanted = {(m.name, d.upper()): (m, d) for m in self.watch.catalog.models for d in m.devices}
        for child in self.workers:
            if (child.model, child.device) not in wanted and not child.retired:
                child.retired = True
                log(f"{child.name}: no longer in the models file; it finishes its jobs and stops")
        have = {(c.model, c.device) for c in self.workers if not c.retired}
        for key, (model, device) in wanted.items():
            if key not in have and _prepare(model):
                child = _worker(model, device, self.env)
                self.workers.append(child)
                child.start()
                log(f"{child.name}: added to the models file; starting it")

    def close(self) -> None:
        self.client.close()


def _stop_in_order(why: str, workers: list[Child], api: Child, batch: Child, redis: EmbeddedRedis | None,
                   settings: Settings) -> None:
    log(f"{why}: stopping the batch worker and the API, then the workers "
        f"(grace {settings.shutdown_grace_s:.0f}s), then Redis")
    batch.stop(settings.shutdown_grace_s + 10)  # first: its lines in flight need the API and the workers
    api.stop(settings.shutdown_grace_s + 10)  # a SIGTERM while it starts is kept for uvicorn (common/signals.py)
    for child in workers:  # all at once: each drains its own jobs within the grace period
        if child.running:
            child.process.send_signal(signal.SIGTERM)
    for child in workers:
        child.stop(settings.shutdown_grace_s + 10)
    if redis:
        redis.stop()


def serve(args: argparse.Namespace) -> int:
    env = {**os.environ, **api_env(args)}
    keys = {**key_env(args), **exposure.env(args)}  # for the API only: workers never see a key
    os.environ.update(env)
    settings = Settings()
    try:
        _check_key_files({**env, **keys})
        refused = exposure.refusal({**env, **keys})
        url = redis_url(settings)
    except (KeyFileError, RedisURLError) as exc:
        log(str(exc))
        return 2
    if refused:
        log(refused)
        return 2
    models = ovms.checked_models(settings, "ovq serve")
    if models is None:
        return 2
    stopper = Stopper()
    signal.signal(signal.SIGINT, stopper)
    signal.signal(signal.SIGTERM, stopper)
    progress = Progress("ovq serve")
    redis = None
    try:
        if not all(_prepare(model) for model in models):
            return 1
        if not settings.redis_url:
            redis = EmbeddedRedis(embedded_socket(settings).parent)
            started = _start_redis(redis, progress)
            if started is None:
                return 1
            url = env["REDIS_URL"] = started
            _forget_other_models(url, settings, models)
        stopper.interrupt = False  # from here on the children are stopped in order, by the `finally` below
    except Interrupted:
        progress.close()
        log(f"{stopper.why}: stopping{' Redis' if redis else ''} before anything else started")
        if redis:
            redis.stop()
        return 0
    workers, api, batch = _children(models, env, keys)
    children = [*workers, api, batch]
    failure, follow = None, None
    try:
        for child in children:
            child.start()
        failure = _wait_until_serving(workers, api, batch, stopper, progress, settings, url)
        progress.close()
        if failure:
            log(failure)
        elif not stopper.why:
            log(f"serving {', '.join(m.name for m in models)} on http://{settings.host}:{settings.port}/v3 "
                f"(Redis: {'embedded, ' + str(embedded_socket(settings)) if redis else settings.redis_url}); "
                "Ctrl-C stops")
        follow = Follow(settings, url, env, workers) if has_models(settings) and settings.config_poll_s > 0 else None
        if follow is not None:  # what the file gained or lost while the children started, which no poll will see
            follow.apply()
        while not failure and not stopper.why and not all(c.given_up or c.retired for c in [*workers, api, batch]):
            if follow is not None:
                follow.tick()
            for child in [*workers, api, batch]:
                child.check()
            time.sleep(0.2)
    finally:
        if follow is not None:
            follow.close()
        progress.close()
        _stop_in_order(stopper.why or ("not serving" if failure else "every child failed"), workers, api, batch,
                       redis, settings)
    return 0 if stopper.why and not failure else 1


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="embedded Redis + a worker per model and device + the API, on one machine")
    add_api_arguments(p, processes="--api-processes")
    p.set_defaults(func=serve)
