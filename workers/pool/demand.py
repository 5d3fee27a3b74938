"""The fleet's waiting work per model, read from Redis the way the API's and KEDA's counts read it: per priority
level stream, waiting = XLEN - what live workers hold (acked entries are deleted; parked jobs, and those a dead
worker held, count as waiting), plus the requests that wait for the first card of a model no worker has announced
(`Keys.awaiting`). Two round trips for any number of models: the counts, then the oldest undelivered entries of the
streams where work waits (their age, and their tokens as an estimate for the rest)."""
from __future__ import annotations

import time
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.jobs import ENTRY_JOB, LEVELS
from common.keys import GROUP, Keys
from workers.pool.policy import Demand

SAMPLE = 16  # undelivered entries read per stream: their mean tokens stand for the rest
OUTPUT_GUESS = 256  # expected output tokens of a job that sets no max_tokens
CHARS_PER_TOKEN = 4
Sampled = list[tuple[str, str, bytes | str, int]]  # (model, stream, read after this entry id, its waiting jobs)


def job_tokens(raw: bytes) -> int:
    """A queued job's estimated tokens: its prompt (a rendered string, or token ids) and its output budget."""
    try:
        job = orjson.loads(raw)
        prompt = job.get("prompt") or ""
        params = job.get("params") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return OUTPUT_GUESS
    given = len(prompt) if isinstance(prompt, list) else len(prompt) // CHARS_PER_TOKEN
    return given + (params.get("max_tokens") or OUTPUT_GUESS) * max(1, int(params.get("n") or 1))


def _ms(entry_id: Any) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(text.split("-")[0])


async def read(redis: aioredis.Redis, keys: Keys, models: list[str], device: str, worker_ttl_s: float,
               first_devices: dict[str, str] | None = None, me: str = "") -> dict[str, Demand]:
    """Each model's demand on `device`. `first_devices`: the models file's first device of each model, where the API
    counts requests waiting for a card (elsewhere none wait). `me`: the reading pool, whose own claims are not
    another's."""
    now = time.time()
    first_devices = first_devices or {}
    pipe = redis.pipeline(transaction=False)
    for model in models:
        for level in LEVELS:
            stream = keys.level_jobs(model, device, level)
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
            pipe.xinfo_groups(stream)
        if first_devices.get(model, device) == device:
            pipe.llen(keys.awaiting(model, device))
        else:
            pipe.echo(0)  # keeps the replies in step
        pipe.zrangebyscore(keys.workers(model, device), now - worker_ttl_s, "+inf")
        pipe.get(keys.pool_claim(model, device))
    replies = iter(await pipe.execute(raise_on_error=False))
    counts: dict[str, tuple[int, int, bool, bool]] = {}
    sampled: Sampled = []
    for model in models:
        waiting_jobs, oldest_ms = 0, 0
        per_level = [(next(replies), next(replies), next(replies)) for _ in LEVELS]
        awaiting, members, claim = next(replies), next(replies), next(replies)
        live = {_text(m) for m in members} if isinstance(members, list) else set()
        for level, (length, pending, groups) in zip(LEVELS, per_level, strict=True):
            if isinstance(length, ResponseError) or not length:
                continue
            held = 0 if isinstance(pending, ResponseError) else held_by(pending, live)
            waiting = max(int(length) - held, 0)
            if not waiting:
                continue
            waiting_jobs += waiting
            delivered = _last_delivered(groups)
            sampled.append((model, keys.level_jobs(model, device, level), delivered, waiting))
            if isinstance(pending, dict) and pending.get("pending") and held < int(pending["pending"]):
                oldest_ms = min(filter(None, (oldest_ms, _ms(pending["min"]))))  # parked jobs wait too
        awaiting = int(awaiting) if isinstance(awaiting, int) else 0
        claimed = isinstance(claim, bytes) and claim.decode() != me
        counts[model] = (waiting_jobs + awaiting, oldest_ms, bool(live), claimed)
    samples = await _sample(redis, sampled)
    found: dict[str, Demand] = {}
    for model in models:
        waiting, oldest_ms, served, claimed = counts[model]
        tokens, first = samples.get(model, (0, 0))
        oldest = min(filter(None, (oldest_ms, first)), default=0)
        if waiting and not tokens:  # only requests awaiting a card: no job to read yet
            tokens = waiting * OUTPUT_GUESS
        found[model] = Demand(waiting=waiting, tokens=tokens, served=served, claimed=claimed,
                              oldest_s=max(now - oldest / 1000, 0.0) if oldest else 0.0)
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def held_by(pending: dict[str, Any], live: set[str]) -> int:
    """Of XPENDING's summary, the jobs live workers hold. Those of dead consumers wait as well: no worker of the
    model is left to reclaim them until one is loaded (and parked jobs, common/fairness.py's, wait for any)."""
    return sum(int(c["pending"]) for c in pending.get("consumers") or () if _text(c["name"]) in live)


def _last_delivered(groups: Any) -> bytes | str:
    if isinstance(groups, list):
        for group in groups:
            name = group.get("name")
            if (name.decode() if isinstance(name, bytes) else name) == GROUP:
                return group.get("last-delivered-id") or "0-0"
    return "0-0"


async def _sample(redis: aioredis.Redis, sampled: Sampled) -> dict[str, tuple[int, int]]:
    """Per model: estimated waiting tokens, and the oldest undelivered entry's time (ms; 0: none read)."""
    if not sampled:
        return {}
    pipe = redis.pipeline(transaction=False)
    for _, stream, after, _ in sampled:
        after_text = after.decode() if isinstance(after, bytes) else after
        pipe.xrange(stream, f"({after_text}", "+", count=SAMPLE)
    out: dict[str, tuple[int, int]] = {}
    for (model, _, _, waiting), entries in zip(sampled, await pipe.execute(raise_on_error=False), strict=True):
        if isinstance(entries, ResponseError) or not entries:
            continue
        each = [job_tokens(fields.get(ENTRY_JOB.encode(), b"")) for _, fields in entries]
        tokens, first = out.get(model, (0, 0))
        out[model] = (tokens + round(sum(each) / len(each) * waiting),
                      min(filter(None, (first, _ms(entries[0][0])))))
    return out
