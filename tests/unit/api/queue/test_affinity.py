"""Prefix affinity's API half: the prompt's prefix digests, and the enqueue into a preferred worker's stream on the
real redis-server."""
from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from api.queue.affinity import TOKEN_BLOCK, boundaries, candidates, prefix_digests
from api.queue.registry import Registry
from common.jobs import Job, SamplingParams
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.ops.cluster import streams
from common.servable import ServableType
from common.settings import Settings

SYSTEM = "<|im_start|>system\nYou answer questions about a long shared manual. " + "Rule. " * 100 + "<|im_end|>\n"


def turn(n: int, conversation: str) -> str:
    text = SYSTEM
    for i in range(n):
        text += f"<|im_start|>user\n{conversation} question {i}: " + "why? " * 30 + "<|im_end|>\n"
        text += "<|im_start|>assistant\n" + (f"answer {i} " * 20 + "<|im_end|>\n" if i < n - 1 else "")
    return text


def test_blocks_double_every_sixteen_so_a_long_prompt_has_a_few_dozen_digests() -> None:
    assert boundaries(255, 256) == []
    assert boundaries(256 * 16, 256) == [256 * i for i in range(1, 17)]
    assert boundaries(256 * 16 + 512, 256)[-1] == 256 * 16 + 512
    assert len(boundaries(100_000, 256)) < 80


def test_a_conversations_next_turn_shares_its_last_turns_longest_digests_and_not_another_conversations() -> None:
    first, second = prefix_digests(turn(1, "a"), 256), prefix_digests(turn(2, "a"), 256)
    other = prefix_digests(turn(2, "b"), 256)
    assert len(second) > len(first) > 1
    assert first[0] in second  # the first turn's longest prefix is a prefix of the second turn
    assert second[0] != first[0]  # most specific first
    assert first[0] not in other  # another conversation shares only the system prompt's blocks
    assert set(first) & set(other)
    assert prefix_digests("short", 256) == []


def test_a_cache_key_comes_first_and_token_prompts_are_cut_in_id_blocks() -> None:
    keyed = prefix_digests(turn(1, "a"), 256, key="conv-1")
    assert keyed[0].startswith("k") and keyed[1:] == prefix_digests(turn(1, "a"), 256)
    assert prefix_digests("short", 256, key="conv-1") == keyed[:1]
    ids = list(range(TOKEN_BLOCK * 3))
    assert len(prefix_digests(ids, 256)) == 3
    assert prefix_digests(ids, 256)[-1] == prefix_digests(ids[:TOKEN_BLOCK] + [7], 256)[-1]


def test_candidates_keep_the_most_specific_first_once_each_and_only_the_servables_devices() -> None:
    owners = [None, b"CPU|w2", b"GPU|w9", b"CPU|w1", b"CPU|w2", b"bad"]
    assert [(c.device, c.worker) for c in candidates(owners, ["CPU"])] == [("CPU", "w2"), ("CPU", "w1")]


def card(device: str) -> str:
    return ModelCard(name="m", device=device, servable_type=ServableType.LM_CB, context_length=64,
                     chat_template="x", created=0).model_dump_json()


def job(prompt: str) -> Job:
    return Job(model="m", device="", kind="chat", prompt=prompt, params=SamplingParams(), reply_to="api",
               prefixes=prefix_digests(prompt, 256) or None)


@pytest.fixture()
async def setup(redis_url: str):
    keys = Keys(f"aff{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(affinity=True, affinity_max_waiting=2)
    await redis.hset(keys.model("m"), "CPU", card("CPU"))
    for worker in ("w1", "w2"):
        await redis.zadd(keys.workers("m", "CPU"), {worker: time.time()})
        await redis.xgroup_create(keys.affinity_jobs("m", "CPU", worker), GROUP, id="0", mkstream=True)
    yield redis, keys, Registry(redis, keys, settings, expected=[])
    await redis.aclose()


async def test_a_job_goes_to_the_live_worker_that_served_its_longest_prefix_while_it_has_room(setup) -> None:
    redis, keys, reg = setup
    servable = await reg.servable("m")
    first = job(turn(1, "a"))
    queued = await reg.enqueue(servable, first)
    assert queued.stream == keys.jobs("m", "CPU") and first.affinity is None  # nobody served it yet
    # w1 served the system prompt alone, w2 the whole first turn: the second turn prefers w2.
    await redis.set(keys.prefix_owner("m", first.prefixes[-1]), "CPU|w1")
    await redis.set(keys.prefix_owner("m", first.prefixes[0]), "CPU|w2")
    second = job(turn(2, "a"))
    queued = await reg.enqueue(servable, second)
    w2 = keys.affinity_jobs("m", "CPU", "w2")
    assert (queued.stream, second.affinity, queued.live) == (w2, "w2", True)
    [(entry, fields)] = await redis.xrange(w2)
    assert Job.from_fields(fields).affinity == "w2" and entry.decode() == queued.entry
    assert await redis.hget(keys.job(second.id), "status") == b"queued"
    assert 0 < await redis.ttl(w2)
    # w2 has affinity_max_waiting (2) waiting: the next goes to w1, the next longest match.
    await reg.enqueue(servable, job(turn(2, "a")))
    third = job(turn(2, "a"))
    assert (await reg.enqueue(servable, third)).stream == keys.affinity_jobs("m", "CPU", "w1")
    # A delivered (running) job no longer counts as waiting.
    await redis.xreadgroup(GROUP, "w2", {w2: ">"}, count=1)
    assert (await reg.enqueue(servable, job(turn(2, "a")))).stream == w2


async def test_a_dead_preferred_worker_or_a_non_interactive_job_goes_to_the_shared_stream(setup) -> None:
    redis, keys, reg = setup
    servable = await reg.servable("m")
    prompt = turn(2, "a")
    for digest in job(prompt).prefixes:
        await redis.set(keys.prefix_owner("m", digest), "CPU|w1")
    await redis.zadd(keys.workers("m", "CPU"), {"w1": time.time() - 600})
    dead = job(prompt)
    assert (await reg.enqueue(servable, dead)).stream == keys.jobs("m", "CPU") and dead.affinity is None
    assert Job.from_fields((await redis.xrange(keys.jobs("m", "CPU")))[-1][1]).affinity is None
    await redis.zadd(keys.workers("m", "CPU"), {"w1": time.time()})
    low = job(prompt).model_copy(update={"priority": "low"})
    assert (await reg.enqueue(servable, low)).stream == keys.level_jobs("m", "CPU", "low")
    assert (await reg.enqueue(servable, job(prompt))).stream == keys.affinity_jobs("m", "CPU", "w1")


@pytest.mark.parametrize(("word", "parsed"), [("auto", "auto"), ("1", "true"), ("on", "true"), ("no", "false"),
                                              (True, "true"), (False, "false")])
def test_ovq_affinity_takes_auto_and_boolean_words(word: object, parsed: str) -> None:
    assert Settings(affinity=word).affinity == parsed


async def test_auto_affinity_applies_only_to_a_model_whose_card_says_it_caches_prefixes(setup) -> None:
    redis, keys, _ = setup
    reg = Registry(redis, keys, Settings(affinity="auto"), expected=[])
    prompt = turn(2, "a")
    for digest in job(prompt).prefixes:
        await redis.set(keys.prefix_owner("m", digest), "CPU|w1")
    servable = await reg.servable("m")
    assert not servable.prefix_caching
    assert (await reg.enqueue(servable, job(prompt))).stream == keys.jobs("m", "CPU")
    caching = ModelCard.model_validate_json(card("CPU")).model_copy(update={"prefix_caching": True})
    servable.cards["CPU"] = caching
    assert (await reg.enqueue(servable, job(prompt))).stream == keys.affinity_jobs("m", "CPU", "w1")


async def test_a_draining_preferred_worker_gets_no_affinity_job(setup) -> None:
    redis, keys, reg = setup
    prompt = turn(2, "a")
    for digest in job(prompt).prefixes:
        await redis.set(keys.prefix_owner("m", digest), "CPU|w1")
    servable = await reg.servable("m")
    assert (await reg.enqueue(servable, job(prompt))).stream == keys.affinity_jobs("m", "CPU", "w1")
    await redis.zadd(keys.affinity_draining("m", "CPU"), {"w1": time.time()})
    assert (await reg.enqueue(servable, job(prompt))).stream == keys.jobs("m", "CPU")


async def test_jobs_waiting_in_affinity_streams_count_in_the_wait_estimate_and_the_status(setup) -> None:
    redis, keys, reg = setup
    servable = await reg.servable("m")
    assert await reg.wait_estimate(servable, "interactive") == 0.0
    now = time.time()
    await redis.zadd(keys.affinity_owners("m", "CPU"), {"w1": now, "w2": now})
    w1 = keys.affinity_jobs("m", "CPU", "w1")
    for _ in range(3):
        await redis.xadd(w1, {"job": "x"})
    await redis.xreadgroup(GROUP, "w1", {w1: ">"}, count=1)  # running: no longer waiting
    reg._estimates.clear()
    assert await reg.wait_estimate(servable, "interactive") is None  # 2 wait, none finished lately: unknown
    assert await reg.wait_estimate(servable, "high") == 0.0  # a high job goes before them
    [state] = await streams(redis, keys, Settings(), [("m", "CPU")])
    assert (state.waiting, state.affinity_waiting) == (2, 2)
