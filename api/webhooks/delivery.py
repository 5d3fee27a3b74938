"""Every API process delivers webhook events: a consumer of `Keys.webhooks` (group `workers`), reading new entries
and claiming those another process took and did not finish (it died) after OVQ_WEBHOOK_CLAIM_IDLE_S.

An event entry (`e`, `t`) becomes one delivery entry per endpoint of its tenant that wants its type (FANOUT, which
acks the event in the same script, so it fans out once). A delivery is POSTed, signed, with the event's id as
`webhook-id` on every attempt. Then, in one script each: delivered (2xx) or given up, it is acked and deleted
(FINISH); failed, it moves to `Keys.webhook_retries`, due after an exponential backoff with jitter (RETRY), and is
moved back into the stream when due (PROMOTE) by whichever deliverer looks first. Every attempt is logged
(`Keys.webhook_log`, counted in `Keys.webhook_counts` and in `ovq_webhook_deliveries_total`).

A delivery is made at least once: a process that dies after the receiver took it and before its ack leaves it to
be claimed and sent again, with the same `webhook-id` (receivers deduplicate by it, as Standard Webhooks says).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import httpx
import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from api.http.auth import KeySet
from api.webhooks import guard, signing
from common import tasks
from common.keys import GROUP, Keys
from common.redis.client import UNAVAILABLE, Backoff
from common.settings import Settings
from common.webhooks.endpoints import WebhookEndpoint
from common.webhooks.events import stream_ttl_s
from common.webhooks.log import Attempt

log = logging.getLogger("ovq.api.webhooks")
STOP_WAIT_S = 3.0  # BLOCK_MS and a round trip, with room
BLOCK_MS = 1000  # a read waits this long for new entries (then looks for due retries and abandoned ones)
CLAIM_EVERY_S = 1.0

# KEYS: stream. ARGV: entry id, MAXLEN, TTL, payload, tenant, first attempt (ms), then the endpoints' URLs.
FANOUT = """
if redis.call('XACK', KEYS[1], 'workers', ARGV[1]) == 0 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[1])
for i = 7, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[4], 't', ARGV[5], 'u', ARGV[i], 'n', '0',
             'f', ARGV[6])
end
if #ARGV >= 7 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
return 1
"""
# Logging an attempt (appended to FINISH and RETRY). KEYS[log], KEYS[counts]; ARGV: attempt JSON, outcome, kept, TTL.
LOG = """
local function logged(log, counts, attempt, outcome, kept, ttl)
  redis.call('LPUSH', log, attempt)
  redis.call('LTRIM', log, 0, kept - 1)
  redis.call('EXPIRE', log, ttl)
  redis.call('HINCRBY', counts, outcome, 1)
  redis.call('EXPIRE', counts, ttl)
end
"""
# KEYS: stream, log, counts. ARGV: entry id, attempt JSON, outcome, kept, TTL.
FINISH = LOG + """
redis.call('XACK', KEYS[1], 'workers', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
logged(KEYS[2], KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return 1
"""
# KEYS: stream, retries, log, counts. ARGV: entry id, attempt JSON, kept, TTL, due (ms), the delivery (JSON).
# Acked by another (it claimed this one meanwhile): that one decides what follows; this attempt is still logged.
RETRY = LOG + """
if redis.call('XACK', KEYS[1], 'workers', ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
redis.call('XDEL', KEYS[1], ARGV[1])
logged(KEYS[3], KEYS[4], ARGV[2], 'failed', ARGV[3], ARGV[4])
return 1
"""
# KEYS: retries, stream. ARGV: now (ms), at most this many, MAXLEN, TTL. Due deliveries back into the stream.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, member in ipairs(due) do
  local d = cjson.decode(member)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'e', d.e, 't', d.t, 'u', d.u, 'n', d.n, 'f', d.f)
  redis.call('ZREM', KEYS[1], member)
end
if #due > 0 then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
return #due
"""


def backoff_s(attempts: int, settings: Settings) -> float:
    """The wait after the `attempts`-th failed attempt: doubling from webhook_backoff_s, capped, jittered (half to
    all of it, so receivers that failed together are not retried together)."""
    ceiling = min(settings.webhook_backoff_max_s, settings.webhook_backoff_s * 2 ** min(attempts - 1, 40))
    return ceiling * random.uniform(0.5, 1.0)


def endpoints_by_tenant(keys: KeySet) -> dict[str, list[WebhookEndpoint]]:
    """Each tenant's endpoints over all its keys (one per URL: the first key's secret)."""
    found: dict[str, dict[str, WebhookEndpoint]] = {}
    for attributes in keys.attributes:
        for endpoint in attributes.webhooks:
            found.setdefault(attributes.who, {}).setdefault(endpoint.url, endpoint)
    return {tenant: list(urls.values()) for tenant, urls in found.items()}


class Deliverer:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings,
                 endpoints: dict[str, list[WebhookEndpoint]], consumer: str, counted: Callable[[str], None]) -> None:
        """`consumer`: this process's name in the group (its reply_to); `counted`: called with each outcome."""
        self.redis, self.keys, self.settings, self.endpoints = redis, keys, settings, endpoints
        self.consumer, self.counted = consumer, counted
        self.ttl_s = stream_ttl_s(settings)
        self._fanout, self._finish = redis.register_script(FANOUT), redis.register_script(FINISH)
        self._retry, self._promote = redis.register_script(RETRY), redis.register_script(PROMOTE)
        self.client = guard.client(settings.webhook_timeout_s, settings.webhook_allow_private)
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._claimed_at = 0.0
        self._stopping = False

    async def start(self) -> Deliverer:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def stop(self) -> None:
        """Stop reading; deliveries under way get up to webhook_timeout_s (what is left is claimed later)."""
        self._stopping = True
        # The loop also ends at its next turn (at most one BLOCK_MS read), should a cancel be swallowed every time.
        await tasks.stop(self._task, STOP_WAIT_S)
        if self._in_flight:
            await asyncio.wait(self._in_flight, timeout=self.settings.webhook_timeout_s)
        for task in self._in_flight:
            task.cancel()
        await self.client.aclose()

    # ---- the loop ----

    async def _run(self) -> None:
        backoff = Backoff(first=0.5)
        await self._group()
        while not self._stopping:
            try:
                await self._step()
                backoff.succeeded(log, "webhook deliveries")
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self._group()  # the stream expired, or a Redis came back without it
            except UNAVAILABLE as exc:
                await asyncio.sleep(backoff.failed(log, "webhook deliveries", exc))
            except Exception:
                log.exception("webhook delivery loop failed; going on")
                await asyncio.sleep(1.0)

    async def _group(self) -> None:
        try:
            await self.redis.xgroup_create(self.keys.webhooks, GROUP, id="0", mkstream=True)
            await self.redis.expire(self.keys.webhooks, self.ttl_s)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        except UNAVAILABLE as exc:
            log.warning("webhook deliveries wait for Redis: %s", exc)

    async def _step(self) -> None:
        free = self.settings.webhook_max_in_flight - len(self._in_flight)
        if free <= 0:
            await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
            return
        now = time.time()
        await self._promote(keys=[self.keys.webhook_retries, self.keys.webhooks],
                            args=[int(now * 1000), free, self.settings.webhook_max_events, self.ttl_s])
        entries: list[tuple[bytes, dict[bytes, bytes]]] = []
        if now - self._claimed_at >= CLAIM_EVERY_S:
            self._claimed_at = now
            reply = await self.redis.xautoclaim(self.keys.webhooks, GROUP, self.consumer,
                                                int(self.settings.webhook_claim_idle_s * 1000), "0-0", free)
            entries = reply[1]  # (next start, entries[, deleted ids: Redis 7 only])
            for entry_id, _ in entries:
                log.info("webhook delivery %s taken over from a process that did not finish it", entry_id.decode())
        if not entries:
            read = await self.redis.xreadgroup(GROUP, self.consumer, {self.keys.webhooks: ">"}, count=free,
                                               block=BLOCK_MS)
            entries = [entry for _, stream_entries in read for entry in stream_entries]
        for entry_id, fields in entries:
            if fields:  # (a claimed entry trimmed meanwhile has none)
                task = asyncio.ensure_future(self._one(entry_id.decode(), fields))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)

    async def _one(self, entry_id: str, raw: dict[bytes, bytes]) -> None:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        try:
            if "u" not in fields:
                await self._fan_out(entry_id, fields)
            else:
                await self._deliver(entry_id, fields)
        except UNAVAILABLE as exc:  # the entry stays pending: claimed again once Redis is back
            log.warning("webhook delivery %s waits for Redis: %s", entry_id, exc)
        except Exception:
            log.exception("webhook delivery %s failed", entry_id)

    # ---- one entry ----

    async def _fan_out(self, entry_id: str, fields: dict[str, str]) -> None:
        kind = orjson.loads(fields["e"])["type"]
        urls = [e.url for e in self.endpoints.get(fields["t"], []) if e.wants(kind)]
        await self._fanout(keys=[self.keys.webhooks], args=[entry_id, self.settings.webhook_max_events, self.ttl_s,
                                                            fields["e"], fields["t"], int(time.time() * 1000), *urls])

    async def _deliver(self, entry_id: str, fields: dict[str, str]) -> None:
        payload = fields["e"].encode()
        event = orjson.loads(payload)
        attempt = Attempt(at=time.time(), event=event["id"], type=event["type"], tenant=fields["t"], url=fields["u"],
                          attempt=int(fields["n"]) + 1, outcome="delivered")
        endpoint = next((e for e in self.endpoints.get(fields["t"], []) if e.url == fields["u"]), None)
        if endpoint is None:  # the operator removed it since: its secret is gone with it
            attempt.outcome, attempt.error = "gave_up", "the endpoint is no longer configured"
            return await self._finished(entry_id, attempt)
        try:
            response = await self.client.post(endpoint.url, content=payload, headers=signing.headers(
                endpoint.key, attempt.event, int(time.time()), payload))
            attempt.status = response.status_code
            if response.is_success:
                return await self._finished(entry_id, attempt)
            attempt.error = f"HTTP {response.status_code}"
        except guard.AddressRefused as exc:
            attempt.outcome, attempt.error = "refused", str(exc)
            log.warning("webhook %s to %s refused: %s", attempt.event, endpoint.url, exc)
            return await self._finished(entry_id, attempt)
        except httpx.HTTPError as exc:
            attempt.error = f"{type(exc).__name__}: {exc}"[:200]
        await self._failed(entry_id, fields, attempt)

    async def _failed(self, entry_id: str, fields: dict[str, str], attempt: Attempt) -> None:
        first_s = int(fields["f"]) / 1000
        wait = backoff_s(attempt.attempt, self.settings)
        if attempt.at + wait - first_s > self.settings.webhook_retry_for_s:
            attempt.outcome = "gave_up"
            log.warning("webhook %s to %s given up after %d attempts: %s", attempt.event, attempt.url,
                        attempt.attempt, attempt.error)
            return await self._finished(entry_id, attempt)
        attempt.outcome, attempt.next_s = "failed", round(wait, 3)
        delivery = orjson.dumps({**fields, "n": str(attempt.attempt)})
        await self._retry(keys=[self.keys.webhooks, self.keys.webhook_retries, self.keys.webhook_log,
                                self.keys.webhook_counts],
                          args=[entry_id, attempt.model_dump_json(), self.settings.webhook_log_kept, self.ttl_s,
                                int((attempt.at + wait) * 1000), delivery])
        self.counted("failed")

    async def _finished(self, entry_id: str, attempt: Attempt) -> None:
        await self._finish(keys=[self.keys.webhooks, self.keys.webhook_log, self.keys.webhook_counts],
                           args=[entry_id, attempt.model_dump_json(), attempt.outcome, self.settings.webhook_log_kept,
                                 self.ttl_s])
        self.counted(attempt.outcome)
        if attempt.outcome == "delivered":
            log.info("webhook %s (%s) delivered to %s, attempt %d", attempt.event, attempt.type, attempt.url,
                     attempt.attempt)
