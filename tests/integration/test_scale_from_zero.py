"""Scale from zero, and restarts that fail nobody: a request for a model the fleet knows, sent while no worker of it
is live, waits in its stream (up to OVQ_QUEUE_TIMEOUT_S) for one to come up; past that it is a 503 with
Retry-After and leaves the stream. A model nobody knows is still a 404 at once."""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from common.modelcard import ModelCard
from common.servable import ServableType
from tests.conftest import MODEL, Tiers
from tests.integration import sse

HELLO = [{"role": "user", "content": "Say hello."}]
# In the models file, never served by any worker: expected, with no card.
ABSENT = "absent-model"


def _models(model_dir: Path) -> dict[str, dict]:
    model = {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 4}
    return {MODEL: model, ABSENT: model}


def _chat(t: Tiers, model: str = MODEL, **extra: object) -> httpx.Response:
    # No retries (the openai SDK would retry a 503); a read timeout well past the queue's.
    return httpx.post(f"{t.base_url}/chat/completions", timeout=600,
                      json={"model": model, "messages": HELLO, "max_tokens": 4, **extra})


def _stream_lines(t: Tiers, model: str = MODEL) -> tuple[int, list[str]]:
    """A streamed chat's status and every line of its body, keep-alive comments included."""
    body = {"model": model, "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{t.base_url}/chat/completions", json=body, timeout=600) as response:
        return response.status_code, [line for line in sse.lines(response) if line]


@pytest.mark.parametrize("since", ["restart", "cold"])
def test_requests_sent_while_no_worker_is_live_wait_for_one(since: str, tiers: Callable[..., Tiers],
                                                            model_dir: Path) -> None:
    """`restart`: the model's only worker went (its card stays): the requests wait in its stream. `cold`: no worker
    has ever announced the model (a fresh fleet, `ovq serve` starting, or scaled to zero past the card TTL): they
    wait for its card first."""
    t = tiers(_models(model_dir))
    t.api()
    stream = t.keys.jobs(MODEL, "CPU")
    r = t.redis()
    if since == "restart":
        first = t.worker(MODEL, name="first")
        t.wait_served(MODEL)
        first.terminate()
        assert first.wait(60) == 0
    else:
        _wait_up(t)
    with ThreadPoolExecutor(3) as pool:
        plain = [pool.submit(_chat, t) for _ in range(2)]
        streamed = pool.submit(_stream_lines, t)
        deadline = time.monotonic() + 60
        while since == "restart" and r.xlen(stream) < 3:  # all three wait in the stream, none refused
            assert time.monotonic() < deadline and not any(f.done() for f in [*plain, streamed]), \
                [f.result().text for f in plain if f.done()]
            time.sleep(0.1)
        # The replacement comes up later (a restart, or a scale-up from zero): a gap with no worker at all, then
        # its start-up (seconds more); the requests are all still waiting at the end of the gap.
        time.sleep(3)
        assert not any(f.done() for f in [*plain, streamed])
        t.worker(MODEL, name="second")
        replies = [f.result() for f in plain]
        status, lines = streamed.result()
    for reply in replies:
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
    assert status == 200
    data = [n for n, line in enumerate(lines) if line.startswith("data:")]
    assert lines[0] == ": ping" and data and data[0] > 0, lines[:5]  # keep-alives before its first token
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines), lines
    assert r.xlen(stream) == 0


def test_a_request_no_worker_takes_in_time_is_a_503_and_leaves_the_stream(tiers: Callable[..., Tiers],
                                                                         model_dir: Path) -> None:
    t = tiers(_models(model_dir), OVQ_QUEUE_TIMEOUT_S="3")
    t.api()
    keys = t.keys
    r = t.redis()
    # The model's worker announced itself, then went (scaled to zero): its card is within the card TTL.
    card = ModelCard(name=MODEL, device="CPU", servable_type=ServableType.LM_CB, context_length=2048,
                     chat_template="{{ messages[0]['content'] }}", created=int(time.time()))
    r.hset(keys.model(MODEL), "CPU", card.model_dump_json())
    r.zadd(keys.models, {MODEL: time.time()})
    _wait_up(t)

    reply = _chat(t)
    assert reply.status_code == 503, reply.text
    assert int(reply.headers["retry-after"]) > 0
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "service_unavailable"
    assert f"`{MODEL}`" in error["message"] and "3s" in error["message"], error
    stream = keys.jobs(MODEL, "CPU")
    assert r.xlen(stream) == 0, "the job left its stream: no worker that comes up later runs it"

    # A stream got its headers and keep-alives while it waited: the refusal is its last event.
    status, lines = _stream_lines(t)
    assert status == 200 and lines[0] == ": ping", lines
    error = orjson.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["type"] == "service_unavailable" and f"`{MODEL}`" in error["message"], lines
    assert lines[-1] == "data: [DONE]" and r.xlen(stream) == 0

    # Expected (the models file) but never announced: it waits for a card, as long, then the same 503.
    reply = _chat(t, ABSENT)
    assert reply.status_code == 503 and f"`{ABSENT}`" in reply.json()["error"]["message"], reply.text
    assert int(reply.headers["retry-after"]) > 0
    status, lines = _stream_lines(t, ABSENT)
    assert status == 200 and lines[0] == ": ping", lines
    error = orjson.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["type"] == "service_unavailable" and f"`{ABSENT}`" in error["message"], lines

    # Nobody knows this one: 404 at once, nothing queued.
    reply = _chat(t, "never-heard-of")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found", reply.text


def _wait_up(t: Tiers, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{t.port}/v2/health/live", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the API did not come up:\n" + "\n".join(t.log(p)[-2000:] for p in t.procs))

