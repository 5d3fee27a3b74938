"""One request, one trace: the API and the worker run as separate processes and export to one OTLP receiver;
their spans form one tree under the client's `traceparent`, with the right parents across the processes."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import MODELS, Tiers
from tests.integration.otlp import ReceivedSpan, Receiver

TINY, IMAGE = "tiny-llama", "tiny-sd"
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
API_PHASES = {"validate", "enqueue", "queue.wait", "respond"}
TEXT_WORKER = {"worker.job", "worker.admit", "engine.prefill", "engine.decode", "worker.publish"}


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    yield got
    got.close()


@pytest.fixture()
def traced(tiers: Callable[..., Tiers], receiver: Receiver) -> Tiers:
    t = tiers({TINY: {"path": str(MODELS / TINY), "cache_size": 0},
               IMAGE: {"path": str(MODELS / IMAGE), "default_num_inference_steps": 2}},
              OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    t.worker(TINY, name="text-worker")
    t.worker(IMAGE, name="image-worker")
    t.api()
    t.wait_served(TINY, IMAGE)
    return t


def _tree(spans: list[ReceivedSpan], request: str) -> tuple[dict[str, ReceivedSpan], ReceivedSpan, ReceivedSpan]:
    by_name = {s.name: s for s in spans}
    root, job = by_name[request], by_name["worker.job"]
    assert root.trace_id == CLIENT_TRACE and root.parent_id == CLIENT_SPAN and root.service == "ovq-api"
    for name in API_PHASES:
        assert by_name[name].parent_id == root.span_id and by_name[name].service == "ovq-api", name
    assert job.parent_id == root.span_id and job.service == "ovq-worker"
    assert root.start_ns <= job.start_ns and job.end_ns <= root.end_ns + 50_000_000  # ends as its event is out
    return by_name, root, job


@pytest.mark.parametrize("stream", [False, True])
def test_one_request_is_one_trace_across_the_tiers(traced: Tiers, receiver: Receiver, stream: bool) -> None:
    body = {"model": TINY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "ignore_eos": True,
            "stream": stream, "stream_options": {"include_usage": True} if stream else None}
    with httpx.stream("POST", f"{traced.base_url}/chat/completions", json=body, timeout=60,
                      headers={"traceparent": TRACEPARENT}) as response:
        assert response.status_code == 200
        response.read()
    spans = receiver.wait_for({"POST /v3/chat/completions", *API_PHASES, *TEXT_WORKER}, CLIENT_TRACE)
    by_name, root, job = _tree(spans, "POST /v3/chat/completions")
    for name in TEXT_WORKER - {"worker.job"}:
        assert by_name[name].parent_id == job.span_id and by_name[name].service == "ovq-worker", name
    assert by_name["engine.prefill"].end_ns <= by_name["engine.decode"].start_ns + 1_000_000
    assert by_name["engine.decode"].attributes["gen_ai.usage.output_tokens"] == 6
    assert root.attributes["gen_ai.usage.output_tokens"] == 6 and root.attributes["http.response.status_code"] == 200
    assert len([s for s in spans if s.name == "worker.job"]) == 1  # one job, one worker span


def test_an_image_job_is_traced_the_same_way(traced: Tiers, receiver: Receiver) -> None:
    response = httpx.post(f"{traced.base_url}/images/generations", timeout=60, headers={"traceparent": TRACEPARENT},
                          json={"model": IMAGE, "prompt": "a red square", "size": "64x64"})
    assert response.status_code == 200
    spans = receiver.wait_for({"POST /v3/images/generations", *API_PHASES, "worker.job", "image.generate",
                               "worker.publish"}, CLIENT_TRACE)
    by_name, _, job = _tree(spans, "POST /v3/images/generations")
    assert by_name["image.generate"].parent_id == job.span_id
    assert by_name["image.generate"].attributes["ovq.steps"] == 2


def test_without_a_client_traceparent_the_request_starts_its_own_trace(traced: Tiers, receiver: Receiver) -> None:
    response = httpx.post(f"{traced.base_url}/completions", timeout=60,
                          json={"model": TINY, "prompt": "Hi", "max_tokens": 2, "ignore_eos": True})
    assert response.status_code == 200
    spans = receiver.wait_for({"POST /v3/completions", "worker.job"})
    root = next(s for s in spans if s.name == "POST /v3/completions")
    assert root.parent_id == "" and root.trace_id != CLIENT_TRACE
    job = next(s for s in receiver.trace(root.trace_id) if s.name == "worker.job")
    assert job.parent_id == root.span_id


@pytest.fixture()
def traced_encoders(tiers: Callable[..., Tiers], receiver: Receiver) -> Tiers:
    t = tiers({"tiny-embed": {"path": str(MODELS / "tiny-embed")},
               "tiny-whisper": {"path": str(MODELS / "tiny-whisper")}},
              OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    t.worker("tiny-embed", name="embed-worker")
    t.worker("tiny-whisper", name="speech-worker")
    t.api()
    t.wait_served("tiny-embed", "tiny-whisper")
    return t


def test_embeddings_and_speech_jobs_are_traced_the_same_way(traced_encoders: Tiers, receiver: Receiver) -> None:
    import io

    import numpy as np
    import soundfile

    response = httpx.post(f"{traced_encoders.base_url}/embeddings", timeout=60, headers={"traceparent": TRACEPARENT},
                          json={"model": "tiny-embed", "input": ["the cat", "a dog"]})
    assert response.status_code == 200
    spans = receiver.wait_for({"POST /v3/embeddings", *API_PHASES, "worker.job", "worker.admit", "embed.batch",
                               "worker.publish"}, CLIENT_TRACE)
    by_name, _, job = _tree(spans, "POST /v3/embeddings")
    assert by_name["embed.batch"].parent_id == job.span_id and by_name["embed.batch"].attributes["ovq.batch_jobs"] == 1
    assert job.attributes["gen_ai.usage.input_tokens"] == response.json()["usage"]["prompt_tokens"]

    other_trace = "5bf92f3577b34da6a3ce929d0e0e4737"
    wav = io.BytesIO()
    soundfile.write(wav, np.zeros(16_000, dtype=np.float32), 16_000, format="WAV")
    response = httpx.post(f"{traced_encoders.base_url}/audio/transcriptions", timeout=60,
                          headers={"traceparent": f"00-{other_trace}-{CLIENT_SPAN}-01"},
                          data={"model": "tiny-whisper"}, files={"file": ("a.wav", wav.getvalue())})
    assert response.status_code == 200
    spans = receiver.wait_for({"worker.job", "speech.transcribe", "worker.publish"}, other_trace)
    by_name = {s.name: s for s in spans}
    assert by_name["speech.transcribe"].parent_id == by_name["worker.job"].span_id
