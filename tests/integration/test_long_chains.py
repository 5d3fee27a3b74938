"""Long Responses chains stay cheap and bounded, through the real tiers and the official SDK: `truncation: "auto"`
keeps a chain longer than the model's context going (and `input_tokens` counts what it keeps), `disabled` refuses
it as OpenAI does, `/responses/compact` answers the model's own summary, and a turn's Redis work at turn 50 is a
turn's at turn 5.

The tiny Llama (a 2,048-token context) with ~500-token turns: its context holds about four of them. The tiers run
on a Redis of their own, so that the server's command and byte counters (INFO commandstats and stats) are theirs.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis
from openai import OpenAI

from api.openai.responses.compact import INSTRUCTION
from api.openai.responses.convert import SUMMARY
from common.keys import Keys
from common.redis.server import EmbeddedRedis
from tests.conftest import MODELS, Tiers, free_port

pytestmark = pytest.mark.e2e

TINY = "tiny-llama"
CONTEXT = 2048
LONG = "The reading room holds the catalogue, the atlases and the periodicals of the library. " * 11  # ~500 tokens
TURN: dict[str, Any] = {"model": TINY, "temperature": 0, "max_output_tokens": 16, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    work = tmp_path_factory.mktemp("chains")
    server = EmbeddedRedis(work / "redis", port=free_port(), appendonly=False)
    t = Tiers(server.start(), work, {TINY: {"path": str(MODELS / TINY), "cache_size": 0}},
              OVQ_RECLAIM_INTERVAL_S="60")  # fewer of the timers' commands between a turn's
    t.worker(TINY)
    t.api()
    t.wait_served(TINY)
    yield t
    t.stop()
    server.stop()


@pytest.fixture(scope="module")
def client(tiers: Tiers) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{tiers.port}/v1", api_key="unused", max_retries=0, timeout=120)


def chain(client: OpenAI, turns: int, previous: str | None = None, **fields: Any) -> list[Any]:
    responses = []
    for i in range(turns):
        response = client.responses.create(input=f"{i}: {LONG}", previous_response_id=previous, **TURN, **fields)
        responses.append(response)
        previous = response.id
    return responses


def test_truncation_auto_keeps_a_chain_longer_than_the_context_going(client: OpenAI) -> None:
    responses = chain(client, 7, truncation="auto")
    assert all(r.status == "incomplete" and r.truncation == "auto" for r in responses)  # 16 tokens: the limit
    used = [r.usage.input_tokens for r in responses]
    assert used[-1] > used[0] and max(used) <= CONTEXT - TURN["max_output_tokens"], used  # 7 x ~500: some dropped
    # input_tokens counts what a response of the same body keeps, and that is what the response used
    turn = {"model": TINY, "input": f"7: {LONG}", "previous_response_id": responses[-1].id, "truncation": "auto"}
    # (the same body as create's: the SDK's count takes no max_output_tokens, what the cut leaves room for)
    counted = client.responses.input_tokens.count(**turn, extra_body={"max_output_tokens": 16}).input_tokens
    following = client.responses.create(**turn, max_output_tokens=16, temperature=0)
    assert counted == following.usage.input_tokens <= CONTEXT - 16


def test_truncation_disabled_refuses_a_chain_longer_than_the_context_as_openai_does(client: OpenAI) -> None:
    first = chain(client, 3)  # ~1,500 tokens: fits; a fourth turn does not (the worker says so)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input=f"3: {LONG}", previous_response_id=first[-1].id, model=TINY,
                                max_output_tokens=16)
    assert (caught.value.body["code"], caught.value.body["param"]) == ("context_length_exceeded", "input")
    # A chain whose responses no longer all fit (it went on with auto) is refused by the API before any read of it
    long = chain(client, 6, truncation="auto")
    for call in (client.responses.create, client.responses.input_tokens.count):
        with pytest.raises(openai.BadRequestError) as caught:
            call(input="And then?", previous_response_id=long[-1].id, model=TINY)
        assert (caught.value.body["code"], caught.value.body["param"]) == ("context_length_exceeded", "input")


def test_compact_gives_the_user_messages_and_the_models_own_summary(client: OpenAI) -> None:
    responses = chain(client, 3, truncation="auto")
    compacted = client.responses.compact(model=TINY, previous_response_id=responses[-1].id,
                                         input=[{"role": "user", "content": "And the maps?"}])
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    *users, item = compacted.output
    texts = [u.content[0].text for u in users]
    assert texts == [f"{i}: {LONG}" for i in range(3)] + ["And the maps?"]
    assert item.type == "compaction" and item.encrypted_content
    assert compacted.usage.output_tokens > 0 and compacted.usage.input_tokens > 0
    # The summary is the model's answer (greedy) to the conversation it fits, then the instruction, through chat.
    messages = [{"role": "user", "content": texts[0]}]
    for previous, text in zip(responses, texts[1:], strict=True):
        messages += [{"role": "assistant", "content": previous.output_text}, {"role": "user", "content": text}]
    messages.append({"role": "user", "content": INSTRUCTION})
    assert item.encrypted_content == _fitted_answer(client, messages, compacted.usage.input_tokens)
    # A later request takes the compacted window as its input (here the user messages alone are most of the
    # context: with auto its oldest turns go, as a chain's would).
    window = compacted.model_dump(exclude_none=True, warnings=False)["output"]  # (the SDK types output as assistant's)
    after = client.responses.create(input=[*window, {"role": "user", "content": "Go on."}], truncation="auto", **TURN)
    assert after.status == "incomplete" and after.output_text
    assert after.usage.input_tokens < sum(r.usage.input_tokens for r in responses)
    count = client.responses.input_tokens.count(model=TINY, input=[{"type": "compaction", "encrypted_content": "x"},
                                                                   {"role": "user", "content": "Go on."}])
    bare = client.responses.input_tokens.count(model=TINY, input=[{"role": "assistant", "content": SUMMARY + "x"},
                                                                  {"role": "user", "content": "Go on."}])
    assert count.input_tokens == bare.input_tokens  # the summary reads as the assistant's own note


def _fitted_answer(client: OpenAI, messages: list[dict[str, Any]], prompt_tokens: int) -> str:
    """Chat's greedy answer to the newest turns of `messages` whose prompt is `prompt_tokens` (the summary's)."""
    for start in range(0, len(messages), 2):
        try:
            reply = client.chat.completions.create(model=TINY, messages=messages[start:], temperature=0,
                                                   max_tokens=min(512, CONTEXT // 4))
        except openai.BadRequestError:  # over the context: fewer turns
            continue
        if reply.usage.prompt_tokens == prompt_tokens:
            return reply.choices[0].message.content or ""
    raise AssertionError(f"no suffix of the conversation makes a {prompt_tokens}-token prompt")


def test_compact_with_nothing_to_compact_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.compact(model=TINY)
    assert caught.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        client.responses.compact(model=TINY, previous_response_id="resp_0123456789abcdef0123456789abcdef")


def counters(r: redis.Redis) -> tuple[dict[str, int], int]:
    """Commands the server ran, by command, and the bytes it sent (what its clients read)."""
    calls = {name: entry["calls"] for name, entry in r.info("commandstats").items()}
    return calls, r.info("stats")["total_net_output_bytes"]


def turn_cost(client: OpenAI, r: redis.Redis, keys: Keys, previous: str) -> tuple[int, int, int]:
    """What a turn continuing `previous` costs Redis: commands and bytes read, each the least of five turns (forks
    of `previous`; for the commands, the least of each command's: the workers' and the API's timers, reclaims and
    heartbeats, only ever add), and the bytes it stores (its response's hash)."""
    commands: list[dict[str, int]] = []
    read, stored = [], []
    for _ in range(5):
        calls, sent = counters(r)
        response = client.responses.create(input=f"n: {LONG}", previous_response_id=previous, truncation="auto",
                                           **TURN)
        after, now = counters(r)
        commands.append({name: n - calls.get(name, 0) for name, n in after.items()})
        read.append(now - sent)  # (with the INFO replies': the same at each length)
        stored.append(sum(r.hstrlen(keys.response(response.id), f) for f in r.hkeys(keys.response(response.id))))
    names = set().union(*commands) - {"cmdstat_info", "cmdstat_hkeys", "cmdstat_hstrlen"}
    return sum(min(c.get(name, 0) for c in commands) for name in names), min(read), min(stored)


def test_a_turns_redis_work_at_turn_50_is_a_turns_at_turn_5(client: OpenAI, tiers: Tiers) -> None:
    """With the context full (from about the fourth turn), each turn reads the responses its prompt can hold and
    stores its own: the same commands and bytes at turn 50 as at turn 5. Before, turn 50 read and renewed all 49
    responses before it (98 commands more, ~50 KB more read) and stored their 49 ids."""
    r = tiers.redis()
    responses = chain(client, 5, truncation="auto")
    at5 = turn_cost(client, r, tiers.keys, responses[-1].id)
    responses += chain(client, 45, responses[-1].id, truncation="auto")
    at50 = turn_cost(client, r, tiers.keys, responses[-1].id)
    print(f"commands, bytes read, bytes stored per turn: turn 5 {at5}, turn 50 {at50}")
    assert at50[0] <= at5[0] + 10, (at5, at50)
    assert at50[1] <= at5[1] + 12_000, (at5, at50)  # the timers' noise: heartbeats carry the model card
    assert abs(at50[2] - at5[2]) <= 100, (at5, at50)


def test_compact_takes_an_api_key_like_any_route(tiers: Tiers) -> None:
    reply = httpx.post(f"http://127.0.0.1:{tiers.port}/v1/responses/compact", json={"model": TINY, "input": "hi"},
                       timeout=60)
    assert reply.status_code == 200, reply.text  # keys off here: open; test_tenant_isolation has keys on
    assert reply.json()["object"] == "response.compaction"

