"""Generation stats: histogram buckets and quantiles, windows summed into rates, and what a worker writes."""
from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter

import orjson
import pytest
import redis.asyncio as aioredis

from common.keys import Keys
from common.ops import stats
from common.settings import Settings
from workers.queue.accounting import Accounting
from workers.queue.heartbeat import Rate
from workers.queue.publisher import Outbox, Publisher


def test_an_observation_lands_in_the_first_bucket_whose_bound_holds_it() -> None:
    assert stats.bucket("ttft", 0.5) == "ttft:5"
    assert stats.bucket("ttft", 10) == "ttft:10"  # bounds are inclusive, as Prometheus' `le`
    assert stats.bucket("ttft", 10.01) == "ttft:20"
    assert stats.bucket("ttft", 10**7) == "ttft:inf"
    counts: Counter[str] = Counter()
    stats.observe(counts, "itl", 12.0, n=4)
    assert counts == {"itl:12.5": 4, "itl:sum": 48}


@pytest.mark.parametrize("ms", [3.0, 7.0, 12.0, 16.0, 22.0, 35.0])
def test_a_served_models_inter_token_latency_reads_within_a_few_ms(ms: float) -> None:
    """Latencies where served models sit are told apart, not lumped into one wide low bucket."""
    counts: Counter[str] = Counter()
    stats.observe(counts, "itl", ms, n=100)
    assert abs(stats.quantile(counts, "itl", 0.5) - ms) <= 3.0
    assert len(stats.BOUNDS["itl"]) <= 20 and len(stats.BOUNDS["ttft"]) <= 20  # series per model and device


def test_quantiles_interpolate_within_the_bucket() -> None:
    counts: Counter[str] = Counter()
    for ms in [5] * 50 + [20] * 40 + [70] * 10:  # 50 in (0,5], 40 in (10,20], 10 in (50,75]
        stats.observe(counts, "ttft", ms)
    assert stats.quantile(counts, "ttft", 0.5) == pytest.approx(5.0)
    assert stats.quantile(counts, "ttft", 0.25) == pytest.approx(2.5)
    assert stats.quantile(counts, "ttft", 0.7) == pytest.approx(10 + 10 * 20 / 40)
    assert stats.quantile(counts, "ttft", 0.99) == pytest.approx(50 + 25 * 9 / 10)
    assert stats.quantile(Counter(), "ttft", 0.5) is None
    stats.observe(counts, "ttft", 10**7, n=1000)
    assert stats.quantile(counts, "ttft", 0.99) == 60000  # the open bucket: its lower bound, as Prometheus does


def test_windows_sum_into_rates_series_and_percentiles() -> None:
    now = 1_000_005.0  # 5 s into the window starting at 1_000_000
    current = stats.window_of(now)
    assert current == 1_000_000
    windows = [
        (current - 120, {"tokens": 999, "done": 9}),  # outside the last minute, inside the 5 minutes
        (current - 20, {"tokens": 300, "done": 3, "error": 1, "ttft:100": 4, "itl:20": 300}),
        (current, {"tokens": 100, "done": 1, "cancelled": 1}),
    ]
    summary = stats.summarize(windows, now, span_s=300)
    assert len(summary.series) == 30 and summary.series[-1].t == current
    assert summary.series[-1].tokens_per_s == pytest.approx(100 / 5)  # the current window over its 5 s so far
    assert summary.series[-3].tokens_per_s == pytest.approx(300 / 10)
    assert summary.tokens_per_s == pytest.approx(400 / 55)  # 5 complete windows and 5 s of the current one
    assert summary.requests_per_s == pytest.approx(6 / 55)
    assert (summary.tokens, summary.done, summary.error, summary.cancelled) == (1399, 13, 1, 1)
    assert summary.ttft_ms["p50"] == pytest.approx(87.5)
    assert 17.5 < summary.itl_ms["p99"] <= 20
    assert summary.queue_ms["p50"] is None


def test_outboxes_add_up_their_stats_when_merged() -> None:
    a, b = Outbox(), Outbox()
    a.count("tokens", 3)
    b.count("tokens", 2)
    b.observe("ttft", 40)
    a.merge(b)
    assert a.stats == {"tokens": 5, "ttft:50": 1, "ttft:sum": 40}
    assert Outbox(stats=Counter({"tokens": 1}))  # stats alone are worth a round trip


def test_a_heartbeat_rate_spans_about_its_window() -> None:
    rate = Rate()
    assert rate.update(100.0, 0) == 0.0
    assert rate.update(101.0, 50) == pytest.approx(50.0)
    for t in range(2, 30):
        value = rate.update(100.0 + t, 50 * t)
    assert value == pytest.approx(50.0)
    assert rate.samples[-1][0] - rate.samples[0][0] <= Rate.RATE_WINDOW_S + 1


@pytest.fixture()
async def aredis(redis_url: str):  # type: ignore[no-untyped-def]
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_the_publisher_writes_counts_failures_and_terminal_counts_in_its_round_trip(aredis) -> None:
    keys = Keys(f"st{time.monotonic_ns()}")
    settings = Settings(stats_ttl_s=120, failed_jobs_kept=2, log_jobs=True)
    accounting = Accounting(keys, "m", "CPU", "w1", settings)
    publisher = Publisher(aredis, keys, keys.jobs("m", "CPU"), 60, accounting)
    publisher.start()
    outbox = Outbox()
    outbox.count("tokens", 7)
    outbox.observe("ttft", 30)
    outbox.set_status("j1", status="done", total_ms=400.0, prompt_tokens=3, completion_tokens=7)
    for i in range(3):
        outbox.set_status(f"bad{i}", status="error", error={"message": f"boom {i}", "type": "server_error"})
    outbox.set_status("j2", status="running")
    publisher.put(outbox)
    await publisher.drain()
    await publisher.stop()
    key = keys.stats("m", "CPU", stats.window_of(time.time()))
    written = {k.decode(): int(v) for k, v in (await aredis.hgetall(key)).items()}
    if not written:  # the window turned between the write and this read
        key = keys.stats("m", "CPU", stats.window_of(time.time()) - stats.WINDOW_S)
        written = {k.decode(): int(v) for k, v in (await aredis.hgetall(key)).items()}
    assert written["tokens"] == 7 and written["ttft:35"] == 1
    assert written["done"] == 1 and written["error"] == 3 and "running" not in written
    assert written["e2e:500"] == 1
    assert 0 < await aredis.ttl(key) <= 120
    failed = [orjson.loads(raw) for raw in await aredis.lrange(keys.failed, 0, -1)]
    assert [f["job"] for f in failed] == ["bad2", "bad1"]  # newest first, capped at 2
    assert failed[0]["message"] == "boom 2" and failed[0]["worker"] == "w1" and failed[0]["model"] == "m"
    assert 0 < await aredis.ttl(keys.failed) <= 120
    assert await aredis.hget(keys.job("j1"), "completion_tokens") == b"7"
    summaries = await stats.read(aredis, keys, [("m", "CPU"), ("other", "GPU")])
    assert summaries[("m", "CPU")].tokens == 7 and summaries[("other", "GPU")].tokens == 0


def test_the_job_log_line_says_what_an_operator_asks(caplog: pytest.LogCaptureFixture) -> None:
    accounting = Accounting(Keys("t"), "m", "CPU", "w1", Settings(log_jobs=True))
    counts: Counter[str] = Counter()
    with caplog.at_level("INFO", logger="ovq.jobs"):
        accounting.settle({"abc": {"status": "done", "prompt_tokens": 5, "completion_tokens": 9, "queue_ms": 1.5,
                                   "ttft_ms": 20.2, "total_ms": 99.9}}, counts)
    assert caplog.messages == ["job abc model=m device=CPU status=done prompt_tokens=5 completion_tokens=9 "
                               "queue_ms=2 ttft_ms=20 total_ms=100"]
    quiet = Accounting(Keys("t"), "m", "CPU", "w1", Settings(log_jobs=False))
    caplog.clear()
    with caplog.at_level("INFO", logger="ovq.jobs"):
        quiet.settle({"abc": {"status": "cancelled"}}, counts)
    assert caplog.messages == [] and counts["cancelled"] == 1


def hincrbys(commands: list[list]) -> Counter[str]:
    """What a round trip's HINCRBY commands add, by field."""
    counts: Counter[str] = Counter()
    for command in commands:
        if command[0] == "HINCRBY":
            counts[command[2]] += command[3]
    return counts


def test_counts_go_out_at_most_once_a_second_and_none_is_lost() -> None:
    accounting = Accounting(Keys("t"), "m", "CPU", "w1", Settings())
    first: list[list] = []
    later: list[list] = []
    accounting.settle({}, Counter(tokens=3))
    accounting.write(first, [])
    accounting.written(True)
    assert hincrbys(first) == {"tokens": 3}
    accounting.settle({"j": {"status": "done"}}, Counter(tokens=4))
    accounting.write(later, [])  # within the second: held
    assert not hincrbys(later) and accounting.pending == {"tokens": 4, "done": 1}
    accounting.write(later, [], everything=True)  # the last round trip (stop)
    accounting.written(False)  # ...failed: the counts are pending again, for its retry
    assert accounting.pending == {"tokens": 4, "done": 1}
    accounting.write(later, [], everything=True)
    accounting.written(True)
    assert hincrbys(later) == {"tokens": 8, "done": 2} and not accounting.pending  # the failed try, then the retry


async def test_stopping_with_redis_gone_drops_the_pending_counts_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """Redis stopping with the worker (a Procfile, compose down) must not hold the worker's exit."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = aioredis.Redis(port=port, socket_connect_timeout=1)
    keys = Keys("t")
    accounting = Accounting(keys, "m", "CPU", "w1", Settings())
    accounting.settle({}, Counter(tokens=3))
    publisher = Publisher(gone, keys, keys.jobs("m", "CPU"), 60, accounting)
    publisher.start()
    with caplog.at_level("WARNING", logger="ovq.publisher"):
        await asyncio.wait_for(publisher.stop(), timeout=5)
    assert "stats counts were not written" in caplog.text
    await gone.aclose()
