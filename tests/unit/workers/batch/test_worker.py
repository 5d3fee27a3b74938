"""The batch worker's rq loop once its Redis has stopped: rq's work loop quits on an error from any of these steps,
so each must wait for Redis instead of raising."""
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from common.batch.rq_keys import use_rq_prefix
from common.redis.client import keys_for
from common.redis.server import EmbeddedRedis
from common.settings import Settings
from tests.conftest import free_port


@pytest.fixture()
def away(tmp_path: Path) -> Iterator[tuple[Settings, redis.Redis, EmbeddedRedis]]:
    """A Redis to build the worker on (rq's constructor talks to it), stopped by the test."""
    server = EmbeddedRedis(tmp_path / "redis", port=free_port())
    url = server.start()
    settings = Settings(redis_wait_s=0.3)
    use_rq_prefix(keys_for(settings))
    yield settings, redis.Redis.from_url(url), server
    server.stop()


def test_the_loops_redis_steps_wait_for_redis_instead_of_ending_the_worker(
        away: tuple[Settings, redis.Redis, EmbeddedRedis], caplog: pytest.LogCaptureFixture) -> None:
    from workers.batch.worker import BatchWorker

    settings, connection, server = away
    worker = BatchWorker(settings, connection, name="bw-away")
    server.stop()
    with caplog.at_level(logging.WARNING, logger="ovq.batch"):
        worker.check_for_suspension(False)
        worker.run_maintenance_tasks()
        worker.heartbeat()
        worker.set_state("idle")
    assert caplog.text.count("Redis unavailable") == 4, caplog.text


def test_a_start_without_redis_tries_again_then_says_so(away: tuple[Settings, redis.Redis, EmbeddedRedis],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from workers.batch.worker import BatchWorker

    settings, connection, server = away
    worker = BatchWorker(settings, connection, name="bw-away-start")
    server.stop()
    with caplog.at_level(logging.WARNING, logger="ovq.batch"), pytest.raises(redis.ConnectionError):
        worker.bootstrap()
    assert "batch worker starting: Redis unavailable" in caplog.text
