"""When `ovq serve` may say "serving": its API answers the health probe, and every worker it started has
announced itself the way the API's registry (api/queue/registry.py) decides a model is served: the model's card
names the device, and the device's workers set holds a heartbeat younger than OVQ_WORKER_TTL_S. The announcing
worker must be the process `ovq serve` started (host and pid in its worker hash, workers/queue/heartbeat.py): a
card and a heartbeat that an earlier run left behind are not it.

Each wait is bounded by the settings the tier itself honours, plus START_SLACK_S for the process to come up: a
worker may wait OVQ_REDIS_WAIT_S for Redis, then OVQ_ENGINE_START_TIMEOUT_S for its engine to load the model (a
first load can take minutes); the API waits OVQ_REDIS_WAIT_S for Redis."""
from __future__ import annotations

import socket
import time

import httpx

from common.redis.client import UNAVAILABLE, keys_for, sync_client
from common.settings import Settings

START_SLACK_S = 60.0
PROBE_TIMEOUT_S = 2.0


def worker_bound_s(settings: Settings) -> float:
    return settings.redis_wait_s + settings.engine_start_timeout_s + START_SLACK_S


def api_bound_s(settings: Settings) -> float:
    return settings.redis_wait_s + START_SLACK_S


def local_url(host: str, port: int) -> str:
    """Where this machine reaches an API bound to `host` (a wildcard address is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def api_answers(base: str) -> bool:
    """The API's health probe says ready (it answers, and it reaches Redis)."""
    try:
        return httpx.get(f"{base}/health", timeout=PROBE_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


class Announcements:
    """Reads what the workers write to Redis about themselves."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.client = sync_client(url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S)
        self.keys = keys_for(settings)
        self.worker_ttl_s = settings.worker_ttl_s
        self.host = socket.gethostname()

    def announced(self, model: str, device: str, pid: int) -> bool:
        """The worker process `pid` of this host serves `model` on `device`, as the API would route to it."""
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hexists(self.keys.model(model), device)
            pipe.zrangebyscore(self.keys.workers(model, device), time.time() - self.worker_ttl_s, "+inf")
            has_card, live = pipe.execute()
            if not has_card or not live:
                return False
            pipe = self.client.pipeline(transaction=False)
            for worker_id in live:
                pipe.hmget(self.keys.worker(worker_id.decode()), "host", "pid")
            return any(host == self.host.encode() and found == str(pid).encode()
                       for host, found in pipe.execute())
        except UNAVAILABLE:
            return False

    def close(self) -> None:
        self.client.close()
