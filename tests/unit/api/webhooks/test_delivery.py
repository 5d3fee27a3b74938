"""Webhook delivery on the real redis-server, to a receiver on loopback that verifies each request with the
`standardwebhooks` library: signed deliveries to every endpoint of the event's tenant, retries with backoff under
one webhook-id, giving up, a delivery a dead process held taken over, and the SSRF refusal."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
import redis.asyncio as aioredis

from api.webhooks.delivery import Deliverer
from common.keys import GROUP, Keys
from common.settings import Settings
from common.webhooks.endpoints import WebhookEndpoint
from common.webhooks.events import Emitter
from common.webhooks.log import summary
from tests.webhook_receiver import Receiver

FAST = {"webhook_backoff_s": 0.2, "webhook_backoff_max_s": 1.0, "webhook_timeout_s": 5.0, "journal_ttl_s": 60}


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture()
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


MADE: list[Deliverer] = []


@pytest.fixture(autouse=True)
async def stopped(redis: aioredis.Redis) -> AsyncIterator[None]:
    """Every deliverer a test made stops with it, whatever became of the test."""
    yield
    while MADE:
        await MADE.pop().stop()


def deliverer(redis: aioredis.Redis, keys: Keys, urls: dict[str, list[str]], secret: str, name: str = "api-1",
              counted: list[str] | None = None, **settings: object) -> Deliverer:
    endpoints = {tenant: [WebhookEndpoint(url=u, secret=secret) for u in listed] for tenant, listed in urls.items()}
    s = Settings(**{**FAST, "webhook_allow_private": True, **settings})  # type: ignore[arg-type]
    MADE.append(Deliverer(redis, keys, s, endpoints, name, (counted if counted is not None else []).append))
    return MADE[-1]


async def until(check, timeout: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_an_event_reaches_each_endpoint_of_its_tenant_signed(redis: aioredis.Redis, receiver: Receiver) -> None:
    keys = Keys(f"wh{time.time_ns()}")
    other = Receiver(secret=receiver.secret).start()
    try:
        d = await deliverer(redis, keys, {"alpha": [receiver.url, other.url], "beta": [other.url]},
                            receiver.secret).start()
        emitter = Emitter(redis, keys, Settings(**FAST))  # type: ignore[arg-type]
        assert await emitter.once("response.completed", "resp_1", "alpha")
        assert not await emitter.once("response.completed", "resp_1", "alpha")  # a second saver emits nothing
        got, also = await asyncio.to_thread(receiver.wait, 1), await asyncio.to_thread(other.wait, 1)
        await d.stop()
    finally:
        other.stop()
    assert len(got) == len(also) == 1 and got[0].verified and also[0].verified
    assert got[0].id == also[0].id == got[0].event["id"] and got[0].id.startswith("evt_")
    event = openai.OpenAI(api_key="x", webhook_secret=receiver.secret).webhooks.unwrap(got[0].body, got[0].headers)
    assert event.type == "response.completed" and event.data.id == "resp_1" and event.object == "event"
    assert (await summary(redis, keys)).counts["delivered"] == 2
    assert await redis.xlen(keys.webhooks) == 0  # delivered entries leave the stream


async def test_a_failing_receiver_is_retried_with_backoff_under_one_webhook_id(redis: aioredis.Redis,
                                                                              receiver: Receiver) -> None:
    keys = Keys(f"wh{time.time_ns()}")
    receiver.answers = [500, 503, 502]
    counted: list[str] = []
    d = await deliverer(redis, keys, {"alpha": [receiver.url]}, receiver.secret, counted=counted).start()
    await Emitter(redis, keys, Settings(**FAST)).once("batch.completed", "batch_1", "alpha")  # type: ignore[arg-type]
    got = await asyncio.to_thread(receiver.wait, 1)  # (the receiver's thread; this loop delivers)
    await d.stop()
    assert [r.status for r in got] == [500, 503, 502, 200] and all(r.verified for r in got)
    assert len({r.id for r in got}) == 1  # one event, one webhook-id, however many attempts
    log = list(reversed((await summary(redis, keys)).recent))
    assert [a.attempt for a in log] == [1, 2, 3, 4] and [a.outcome for a in log][-1] == "delivered"
    for attempt, after in zip(log, log[1:], strict=False):  # each wait doubles (jittered: half to all), was kept
        ceiling = min(1.0, 0.2 * 2 ** (attempt.attempt - 1))
        assert attempt.next_s is not None and ceiling / 2 <= attempt.next_s <= ceiling
        assert after.at >= attempt.at + attempt.next_s - 0.002  # (due times are whole ms; next_s is rounded)
    assert counted == ["failed", "failed", "failed", "delivered"]


async def test_a_receiver_that_keeps_failing_is_given_up_after_retry_for(redis: aioredis.Redis,
                                                                        receiver: Receiver) -> None:
    keys = Keys(f"wh{time.time_ns()}")
    receiver.answers = [500] * 1000
    d = await deliverer(redis, keys, {"alpha": [receiver.url]}, receiver.secret, webhook_retry_for_s=1.0).start()
    await Emitter(redis, keys, Settings(**FAST)).once("batch.failed", "batch_2", "alpha")  # type: ignore[arg-type]
    await until(lambda: _counted(redis, keys, "gave_up"))
    await d.stop()
    assert (await summary(redis, keys)).recent[0].outcome == "gave_up"
    assert await redis.zcard(keys.webhook_retries) == 0 and await redis.xlen(keys.webhooks) == 0


async def test_a_delivery_a_dead_process_held_is_taken_over_with_its_id(redis: aioredis.Redis,
                                                                       receiver: Receiver) -> None:
    """A process that read a delivery and died (it never acks) leaves it pending: another claims it once idle."""
    keys = Keys(f"wh{time.time_ns()}")
    urls = {"alpha": [receiver.url]}
    first = await deliverer(redis, keys, urls, receiver.secret, name="api-dead").start()
    receiver.hold_next = True
    await Emitter(redis, keys, Settings(**FAST)).once("response.failed", "resp_3", "alpha")  # type: ignore[arg-type]
    await until(lambda: asyncio.to_thread(receiver.held.is_set))
    first._task.cancel()  # noqa: SLF001 - dies: no ack, no retry entry; the delivery stays pending on it
    for task in first._in_flight:  # noqa: SLF001
        task.cancel()
    pending = await redis.xpending(keys.webhooks, GROUP)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == b"api-dead"
    second = await deliverer(redis, keys, urls, receiver.secret, name="api-2", webhook_claim_idle_s=1.0,
                             webhook_timeout_s=0.9).start()
    got = await asyncio.to_thread(receiver.wait, 1)  # (the receiver's thread; this loop delivers)
    await second.stop()
    assert len(got) == 2 and got[0].id == got[1].id and got[1].verified and got[1].status == 200
    assert (await redis.xpending(keys.webhooks, GROUP))["pending"] == 0


async def test_a_loopback_endpoint_is_refused_unless_allowed(redis: aioredis.Redis, receiver: Receiver) -> None:
    keys = Keys(f"wh{time.time_ns()}")
    counted: list[str] = []
    d = await deliverer(redis, keys, {"alpha": [receiver.url.replace("127.0.0.1", "localhost")]}, receiver.secret,
                        counted=counted, webhook_allow_private=False).start()
    await Emitter(redis, keys, Settings(**FAST)).once("response.completed", "resp_4", "alpha")  # type: ignore[arg-type]
    await until(lambda: _counted(redis, keys, "refused"))
    await d.stop()
    assert receiver.received == [] and counted == ["refused"]
    refused = (await summary(redis, keys)).recent[0]
    assert refused.outcome == "refused" and "not a public address" in (refused.error or "")


async def test_an_event_of_a_tenant_without_endpoints_leaves_the_stream(redis: aioredis.Redis) -> None:
    keys = Keys(f"wh{time.time_ns()}")
    d = await deliverer(redis, keys, {}, "whsec_" + "A" * 32).start()
    await Emitter(redis, keys, Settings(**FAST)).once("response.completed", "resp_5", "nobody")  # type: ignore[arg-type]
    await until(lambda: _empty(redis, keys))
    await d.stop()


async def _counted(redis: aioredis.Redis, keys: Keys, outcome: str) -> bool:
    return bool(await redis.hget(keys.webhook_counts, outcome))


async def _empty(redis: aioredis.Redis, keys: Keys) -> bool:
    return await redis.xlen(keys.webhooks) == 0


async def test_stop_ends_the_loop_even_when_a_cancel_is_taken_for_a_read_timeout(
        redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11 can turn a cancel that lands as redis-py's read times out into that TimeoutError; the loop, which
    waits out an unavailable Redis, then went on for ever and the API never finished its shutdown."""
    d = await deliverer(redis, Keys(f"wh{time.time_ns()}"), {}, "whsec_x").start()
    step = d._step

    async def swallowing_step() -> None:
        try:
            await step()
        except asyncio.CancelledError:
            raise aioredis.TimeoutError("Timeout reading from redis") from None

    monkeypatch.setattr(d, "_step", swallowing_step)
    await asyncio.sleep(0.2)
    await asyncio.wait_for(d.stop(), timeout=10)
    assert d._task is not None and d._task.done()
