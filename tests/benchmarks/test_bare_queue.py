"""benchmarks/bare_queue.py: the bare queue carries each job through a real Redis to its last event, and leaves
its stream as the workers leave theirs (every entry acked and deleted), so its Redis CPU is a full request's."""
from __future__ import annotations

import asyncio
from pathlib import Path

import redis

from benchmarks import bare_queue
from common.redis.server import EmbeddedRedis
from tests.conftest import free_port


def test_every_job_ends_and_leaves_no_entry_behind(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", port=free_port())  # its own: the bare queue's keys are fixed
    url = server.start()
    try:
        done, used, wall = asyncio.run(bare_queue.drive(url, streams=4, rate=100.0, frames=3, duration=1.0))
        client = redis.Redis.from_url(url)
        assert done > 0 and used > 0 and wall > 0
        assert client.xlen(bare_queue.STREAM) == 0
        assert client.xpending(bare_queue.STREAM, bare_queue.GROUP)["pending"] == 0
    finally:
        server.stop()
