"""What `ovq serve` counts as a worker having announced itself, on a real Redis holding what a worker's heartbeat
writes (workers/queue/heartbeat.py), each test under a key prefix of its own."""
from __future__ import annotations

import os
import socket
import time

import pytest
import redis

from cli.readiness import Announcements, api_bound_s, local_url, worker_bound_s
from common.keys import Keys
from common.settings import Settings


@pytest.fixture()
def setup(redis_url: str):
    settings = Settings(key_prefix=f"ready{time.monotonic_ns()}", worker_ttl_s=5)
    announcements = Announcements(redis_url, settings)
    yield redis.Redis.from_url(redis_url), Keys(settings.key_prefix), announcements
    announcements.close()


def beat(r: redis.Redis, keys: Keys, worker: str, pid: int, age_s: float = 0.0, card: bool = True,
         host: str | None = None) -> None:
    """What one heartbeat of a worker of model `m` on CPU writes."""
    now = time.time() - age_s
    r.hset(keys.worker(worker), mapping={"model": "m", "device": "CPU", "host": host or socket.gethostname(),
                                         "pid": pid, "heartbeat": now})
    r.zadd(keys.workers("m", "CPU"), {worker: now})
    if card:
        r.hset(keys.model("m"), "CPU", "{}")


def test_the_started_worker_counts_once_its_heartbeat_and_card_are_there(setup) -> None:
    r, keys, announcements = setup
    assert not announcements.announced("m", "CPU", 4242)
    beat(r, keys, "w1", 4242)
    assert announcements.announced("m", "CPU", 4242)
    assert not announcements.announced("m", "GPU", 4242)


def test_a_card_and_heartbeat_left_by_another_process_do_not_count(setup) -> None:
    r, keys, announcements = setup
    beat(r, keys, "earlier", os.getpid())
    beat(r, keys, "elsewhere", 4242, host="another-host")
    assert not announcements.announced("m", "CPU", 4242)


def test_as_the_api_routes_a_heartbeat_past_the_worker_ttl_or_no_card_does_not_count(setup) -> None:
    r, keys, announcements = setup
    beat(r, keys, "stale", 4242, age_s=6)
    assert not announcements.announced("m", "CPU", 4242)
    beat(r, keys, "carded-elsewhere", 4343, card=False)
    r.delete(keys.model("m"))
    assert not announcements.announced("m", "CPU", 4343)


def test_an_unreachable_redis_is_not_announced_rather_than_an_error(tmp_path) -> None:
    announcements = Announcements(f"unix://{tmp_path / 'none.sock'}?db=0", Settings())
    assert not announcements.announced("m", "CPU", 1)


def test_a_wildcard_bind_address_is_probed_on_loopback() -> None:
    assert local_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert local_url("::", 8000) == "http://[::1]:8000"
    assert local_url("10.1.2.3", 9) == "http://10.1.2.3:9"


def test_the_bounds_are_the_tiers_own_waits_plus_slack() -> None:
    settings = Settings(redis_wait_s=10, engine_start_timeout_s=100)
    assert worker_bound_s(settings) > 110
    assert 10 < api_bound_s(settings) < worker_bound_s(settings)
