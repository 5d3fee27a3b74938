"""Responses and streams that outlive their API process: background responses and resumable chat streams, with
the real tiers. Two API processes share one worker; the one carrying a stream is SIGKILLed mid-stream and the
client resumes on the other: it gets exactly the rest, and the text is the uninterrupted greedy answer."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from common.jobs import JobHash
from common.redis.server import EmbeddedRedis
from tests.conftest import MODEL, MODELS, ROOT, Tiers, free_port
from tests.integration import sse

TINY = "tiny-llama"
BOUND_S = 90
SLOW = 3000  # tokens of the default model: long enough to be cancelled on the way, whatever the machine
LONG = 1900  # tokens: as long as the tiny model's context allows, for generations still running when acted on
PROMPT = "Tell me a long story about a lighthouse."
RESPONSE: dict[str, Any] = {"model": TINY, "input": PROMPT, "temperature": 0, "max_output_tokens": 300,
                            "ignore_eos": True}
CHAT: dict[str, Any] = {"model": TINY, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                        "max_tokens": 300, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def shared(redis_url: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Tiers, int]]:
    """A worker of each model and the API process that survives (its port); each test starts the one it kills.
    The tiny model answers fast; the default one is slow enough to be acted on mid-generation."""
    t = Tiers(redis_url, tmp_path_factory.mktemp("durable"), {TINY: {"path": str(MODELS / TINY), "cache_size": 0},
                                                               MODEL: {"path": str(model_dir), "cache_size": 0}},
              OVQ_RESUME_GRACE_S="2")
    t.worker(TINY, name="tiny")
    t.worker(MODEL)
    t.api()
    t.wait_served(TINY, MODEL)
    yield t, t.port
    t.stop()


def start_api(t: Tiers) -> tuple[subprocess.Popen[bytes], str]:
    proc = t.api()
    t.wait_served(TINY, MODEL)
    return proc, t.base_url


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v3"


def sse_events(response: httpx.Response) -> Iterator[tuple[str | None, bytes]]:
    """(id, data) of each SSE event."""
    event_id, data = None, b""
    for line in sse.lines(response):
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = line[6:].encode()
        elif line == "" and data:
            yield event_id, data
            data = b""


def test_background_response_survives_api_kill(shared: tuple[Tiers, int]) -> None:
    t, survivor = shared
    whole = httpx.post(f"{url(survivor)}/responses", json=RESPONSE, timeout=BOUND_S).json()
    expected = whole["output"][0]["content"][0]["text"]
    doomed, doomed_url = start_api(t)
    seen: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{doomed_url}/responses", json={**RESPONSE, "background": True, "stream": True},
                      timeout=BOUND_S) as response:
        assert response.status_code == 200
        for _, data in sse_events(response):
            seen.append(orjson.loads(data))
            if sum(e["type"] == "response.output_text.delta" for e in seen) >= 3:
                doomed.send_signal(signal.SIGKILL)
                break
    doomed.wait(10)
    t.procs.remove(doomed)
    response_id, last = seen[0]["response"]["id"], seen[-1]["sequence_number"]
    assert seen[0]["response"]["status"] == "queued"
    rest: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{url(survivor)}/responses/{response_id}",
                      params={"stream": "true", "starting_after": last}, timeout=BOUND_S) as response:
        assert response.status_code == 200
        for event_id, data in sse_events(response):
            if data == b"[DONE]":  # the end of a Responses stream, as the Open Responses spec ends one
                break
            rest.append(orjson.loads(data))
            assert event_id == str(rest[-1]["sequence_number"])
    numbers = [e["sequence_number"] for e in seen + rest]
    assert numbers == list(range(len(numbers))), numbers
    assert rest[-1]["type"] in ("response.completed", "response.incomplete")
    text = "".join(e["delta"] for e in seen + rest if e["type"] == "response.output_text.delta")
    assert text == expected
    print(f"\nkill-and-resume: {len(seen)} events before SIGKILL (last sequence_number {last}), "
          f"{len(rest)} after resuming on the other API process; {len(text)} characters, equal to the unary answer")
    stored = httpx.get(f"{url(survivor)}/responses/{response_id}", timeout=BOUND_S).json()
    assert stored["status"] == rest[-1]["response"]["status"] and stored["background"] is True
    assert stored["output"][0]["content"][0]["text"] == expected


def test_background_response_is_retrieved_and_cancelled_from_any_api(shared: tuple[Tiers, int]) -> None:
    t, survivor = shared
    body = {**RESPONSE, "model": MODEL, "max_output_tokens": SLOW, "background": True}
    other, other_url = start_api(t)
    try:
        created = httpx.post(f"{url(survivor)}/responses", json=body, timeout=BOUND_S).json()
        assert created["status"] == "queued" and created["background"] is True
        deadline = time.monotonic() + BOUND_S
        current = created
        while current["status"] != "in_progress" and time.monotonic() < deadline:
            current = httpx.get(f"{other_url}/responses/{created['id']}", timeout=BOUND_S).json()
        assert current["status"] == "in_progress"
        cancelled = httpx.post(f"{other_url}/responses/{created['id']}/cancel", timeout=BOUND_S).json()
        assert cancelled["status"] == "cancelled"
        stored = httpx.get(f"{url(survivor)}/responses/{created['id']}", timeout=BOUND_S).json()
        assert stored["status"] == "cancelled"
    finally:
        other.terminate()
        other.wait(30)


def test_operators_list_and_cancel_background_responses(shared: tuple[Tiers, int]) -> None:
    """`ovq jobs background` and the ops page list them; `ovq jobs cancel` cancels one."""
    t, survivor = shared
    body = {**RESPONSE, "model": MODEL, "max_output_tokens": SLOW, "background": True}
    created = httpx.post(f"{url(survivor)}/responses", json=body, timeout=BOUND_S).json()
    listed = subprocess.run([sys.executable, "-m", "cli.main", "jobs", "background", "--json"], env=t.env,
                            capture_output=True, check=True, cwd=ROOT).stdout
    [mine] = [b for b in orjson.loads(listed) if b["id"] == created["id"]]
    assert mine["status"] in ("queued", "running")
    panel = httpx.get(f"http://127.0.0.1:{survivor}/ops/panel", timeout=BOUND_S).text
    assert created["id"] in panel
    subprocess.run([sys.executable, "-m", "cli.main", "jobs", "cancel", created["id"]], env=t.env, check=True,
                   cwd=ROOT, capture_output=True)
    deadline, current = time.monotonic() + BOUND_S, created
    while current["status"] in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        current = httpx.get(f"{url(survivor)}/responses/{created['id']}", timeout=BOUND_S).json()
    assert current["status"] == "cancelled"


def test_chat_stream_resumes_with_last_event_id(shared: tuple[Tiers, int]) -> None:
    t, survivor = shared
    whole = httpx.post(f"{url(survivor)}/chat/completions", json={**CHAT, "stream": False}, timeout=BOUND_S).json()
    expected = whole["choices"][0]["message"]["content"]
    doomed, doomed_url = start_api(t)
    texts, last_id, contents = [], None, 0
    with httpx.stream("POST", f"{doomed_url}/chat/completions", json=CHAT, headers={"X-Ovq-Resumable": "true"},
                      timeout=BOUND_S) as response:
        assert response.status_code == 200
        for event_id, data in sse_events(response):
            assert event_id is not None
            last_id = event_id
            chunk = orjson.loads(data)
            texts.append(chunk["choices"][0]["delta"].get("content") or "")
            contents += bool(texts[-1])
            if contents >= 3:
                doomed.send_signal(signal.SIGKILL)
                break
    doomed.wait(10)
    t.procs.remove(doomed)
    done = False
    with httpx.stream("POST", f"{url(survivor)}/chat/completions", json=CHAT, headers={"Last-Event-ID": last_id},
                      timeout=BOUND_S) as response:
        assert response.status_code == 200
        for _, data in sse_events(response):
            if data == b"[DONE]":
                done = True
                break
            chunk = orjson.loads(data)
            if chunk["choices"]:
                texts.append(chunk["choices"][0]["delta"].get("content") or "")
    assert done and "".join(texts) == expected


def test_a_resumable_stream_left_for_good_is_cancelled_after_the_grace_period(shared: tuple[Tiers, int],
                                                                               redis_url: str) -> None:
    t, survivor = shared
    body = {**CHAT, "model": MODEL, "max_tokens": SLOW}
    with httpx.stream("POST", f"{url(survivor)}/chat/completions", json=body, headers={"X-Ovq-Resumable": "true"},
                      timeout=BOUND_S) as response:
        job_id = response.headers["x-request-id"]
        for _ in zip(range(3), sse_events(response), strict=False):
            pass
    r = t.redis()
    deadline, status = time.monotonic() + BOUND_S, None
    while status != b"cancelled" and time.monotonic() < deadline:
        time.sleep(0.5)
        status = r.hget(t.keys.job(job_id, MODEL), JobHash.STATUS)
    assert status == b"cancelled"
    assert b"resume_grace_s" in (r.hget(t.keys.job(job_id, MODEL), JobHash.REASON) or b"")


def test_a_background_response_across_a_redis_restart_ends_completed_or_failed(tmp_path: Path) -> None:
    """Redis (append-only) restarts mid-generation: the response completes and is retrievable, or ends `failed`
    with a clear error; never stuck `in_progress`."""
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port)
    redis_url = server.start()
    t = Tiers(redis_url, tmp_path, {TINY: {"path": str(MODELS / TINY), "cache_size": 0}},
              OVQ_BACKGROUND_STALL_S="10")
    try:
        t.worker(TINY)
        t.api()
        t.wait_served(TINY)
        created = httpx.post(f"{t.base_url}/responses", json={**RESPONSE, "max_output_tokens": LONG,
                                                                "background": True}, timeout=BOUND_S).json()
        deadline = time.monotonic() + BOUND_S
        current = created
        while current["status"] == "queued" and time.monotonic() < deadline:
            current = httpx.get(f"{t.base_url}/responses/{created['id']}", timeout=BOUND_S).json()
        server.stop()
        server = EmbeddedRedis(tmp_path / "redis", port=port)
        server.start()
        while current["status"] in ("queued", "in_progress") and time.monotonic() < deadline:
            time.sleep(0.5)
            reply = httpx.get(f"{t.base_url}/responses/{created['id']}", timeout=BOUND_S)
            if reply.status_code == 200:
                current = reply.json()
        assert current["status"] in ("completed", "incomplete", "failed"), current["status"]
        if current["status"] == "failed":
            assert current["error"]["message"]
        else:
            assert current["output"][0]["content"][0]["text"]
        print(f"\nacross a Redis restart: {current['status']} {current.get('error') or ''}")
    finally:
        t.stop()
        server.stop()

