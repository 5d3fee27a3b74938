"""A stateful servable (LLMPipeline, as OVMS runs on NPU) on CPU: one job at a time, the rest wait in Redis."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest
import redis
from openai import OpenAI

from common.keys import GROUP
from tests.conftest import STATEFUL, Stack, raw_greedy, test_keys

KEYS = test_keys("ovqtest")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.numerics
def test_stateful_answer_is_the_stateful_pipelines_own(client: OpenAI, model_dir: Path) -> None:
    prompt = PROMPT.format("What is the capital of France?")
    stateful = client.completions.create(model=STATEFUL, prompt=prompt, temperature=0, max_tokens=30)
    assert "Paris" in stateful.choices[0].text
    assert stateful.choices[0].text == raw_greedy(model_dir, prompt, 30, stateful=True)
    assert stateful.choices[0].finish_reason == "stop"


def test_stateful_stream_has_real_finish_reason_and_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(model=STATEFUL, messages=QUESTION, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_concurrent_jobs_run_strictly_one_after_another(stack: Stack, client: OpenAI,
                                                       redis_client: redis.Redis) -> None:
    job_ids: list[str] = []
    depths: list[int] = []

    def one(i: int) -> None:
        stream = client.chat.completions.create(
            model=STATEFUL, messages=[{"role": "user", "content": f"Count to {i + 5}."}], max_tokens=24,
            stream=True, extra_body={"ignore_eos": True})
        job_ids.append(next(iter(stream)).id.removeprefix("chatcmpl-"))
        for _ in stream:
            pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        text = httpx.get(stack.url("/metrics")).text
        line = next(ln for ln in text.splitlines()
                    if ln.startswith("ovq_queue_waiting_jobs") and f'model="{STATEFUL}"' in ln)
        depths.append(int(float(line.rsplit(" ", 1)[1])))
        time.sleep(0.05)
    # The worker's own clock: a job starts when the worker takes it (queue_ms after creation) and ends at its
    # done event (total_ms); client-side chunk times of different connections cannot order that finely.
    spans = []
    for job_id in job_ids:
        record = redis_client.hgetall(KEYS.job(job_id, STATEFUL))
        created, timings = float(record[b"created"]), orjson.loads(record[b"result"])["timings"]
        spans.append((created + timings["queue_ms"] / 1000, created + timings["total_ms"] / 1000))
    ordered = sorted(spans)
    assert len(ordered) == 3
    for (_, end), (start, _) in zip(ordered, ordered[1:], strict=False):
        assert start >= end, "a job started before the previous one ended"
    assert max(depths) >= 1, "waiting jobs were not visible as queue depth"
    assert redis_client.xpending(KEYS.jobs(STATEFUL, "CPU"), GROUP)["pending"] == 0


def test_cancel_on_a_stateful_worker(client: OpenAI, redis_client: redis.Redis) -> None:
    stream = client.chat.completions.create(model=STATEFUL, messages=QUESTION, max_tokens=2000, stream=True,
                                            extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and redis_client.xpending(KEYS.jobs(STATEFUL, "CPU"), GROUP)["pending"]:
        time.sleep(0.02)
    assert redis_client.xpending(KEYS.jobs(STATEFUL, "CPU"), GROUP)["pending"] == 0
    assert client.chat.completions.create(model=STATEFUL, messages=QUESTION, max_tokens=2).usage.completion_tokens


def test_max_prompt_len_is_enforced_with_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="MAX_PROMPT_LEN"):
        client.chat.completions.create(model=STATEFUL, messages=[{"role": "user", "content": "word " * 200}],
                                       max_tokens=2)
