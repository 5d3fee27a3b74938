"""One request, one trace: the API and the worker run as separate processes and export to one OTLP receiver;
their spans form one tree under the client's `traceparent`, with the right parents across the processes."""
from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import soundfile

from tests.conftest import MODELS, Tiers
from tests.integration.otlp import ReceivedSpan, Receiver

TINY, IMAGE, EMBED, WHISPER = "tiny-llama", "tiny-sd", "tiny-embed", "tiny-whisper"
CLIENT_SPAN = "00f067aa0ba902b7"
API_PHASES = {"validate", "enqueue", "queue.wait", "respond"}
TEXT_WORKER = {"worker.job", "worker.admit", "engine.prefill", "engine.decode", "worker.publish"}


def _client_trace() -> tuple[str, dict[str, str]]:
    """A trace id of the test's own (the module's tiers export every test's spans to one receiver) and its header."""
    trace = uuid.uuid4().hex
    return trace, {"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    yield got
    got.close()


@pytest.fixture(scope="module")
def traced(redis_url: str, tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Tiers]:
    """One API and a worker of each kind (text, image, embeddings, speech), all exporting to the receiver."""
    t = Tiers(redis_url, tmp_path_factory.mktemp("tracing"),
              {TINY: {"path": str(MODELS / TINY), "cache_size": 0},
               IMAGE: {"path": str(MODELS / IMAGE), "default_num_inference_steps": 2},
               EMBED: {"path": str(MODELS / EMBED)}, WHISPER: {"path": str(MODELS / WHISPER)}},
              OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    for model in (TINY, IMAGE, EMBED, WHISPER):
        t.worker(model, name=f"{model}-worker")
    t.api()
    t.wait_served(TINY, IMAGE, EMBED, WHISPER)
    yield t
    t.stop()


def _tree(spans: list[ReceivedSpan], request: str,
          trace: str) -> tuple[dict[str, ReceivedSpan], ReceivedSpan, ReceivedSpan]:
    by_name = {s.name: s for s in spans}
    root, job = by_name[request], by_name["worker.job"]
    assert root.trace_id == trace and root.parent_id == CLIENT_SPAN and root.service == "ovq-api"
    for name in API_PHASES:
        assert by_name[name].parent_id == root.span_id and by_name[name].service == "ovq-api", name
    assert job.parent_id == root.span_id and job.service == "ovq-worker"
    assert root.start_ns <= job.start_ns and job.end_ns <= root.end_ns + 50_000_000  # ends as its event is out
    return by_name, root, job


@pytest.mark.parametrize("stream", [False, True])
def test_one_request_is_one_trace_across_the_tiers(traced: Tiers, receiver: Receiver, stream: bool) -> None:
    trace, headers = _client_trace()
    body = {"model": TINY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "ignore_eos": True,
            "stream": stream, "stream_options": {"include_usage": True} if stream else None}
    with httpx.stream("POST", f"{traced.base_url}/chat/completions", json=body, timeout=60,
                      headers=headers) as response:
        assert response.status_code == 200
        response.read()
    spans = receiver.wait_for({"POST /v3/chat/completions", *API_PHASES, *TEXT_WORKER}, trace)
    by_name, root, job = _tree(spans, "POST /v3/chat/completions", trace)
    for name in TEXT_WORKER - {"worker.job"}:
        assert by_name[name].parent_id == job.span_id and by_name[name].service == "ovq-worker", name
    assert by_name["engine.prefill"].end_ns <= by_name["engine.decode"].start_ns + 1_000_000
    assert by_name["engine.decode"].attributes["gen_ai.usage.output_tokens"] == 6
    assert root.attributes["gen_ai.usage.output_tokens"] == 6 and root.attributes["http.response.status_code"] == 200
    assert len([s for s in spans if s.name == "worker.job"]) == 1  # one job, one worker span


def test_an_image_job_is_traced_the_same_way(traced: Tiers, receiver: Receiver) -> None:
    trace, headers = _client_trace()
    response = httpx.post(f"{traced.base_url}/images/generations", timeout=60, headers=headers,
                          json={"model": IMAGE, "prompt": "a red square", "size": "64x64"})
    assert response.status_code == 200
    spans = receiver.wait_for({"POST /v3/images/generations", *API_PHASES, "worker.job", "image.generate",
                               "worker.publish"}, trace)
    by_name, _, job = _tree(spans, "POST /v3/images/generations", trace)
    assert by_name["image.generate"].parent_id == job.span_id
    assert by_name["image.generate"].attributes["ovq.steps"] == 2


def test_without_a_client_traceparent_the_request_starts_its_own_trace(traced: Tiers, receiver: Receiver) -> None:
    before = {s.trace_id for s in receiver.spans}
    response = httpx.post(f"{traced.base_url}/completions", timeout=60,
                          json={"model": TINY, "prompt": "Hi", "max_tokens": 2, "ignore_eos": True})
    assert response.status_code == 200
    roots = [s for s in receiver.wait_for({"POST /v3/completions"}) if s.name == "POST /v3/completions"]
    root = next(s for s in roots if s.trace_id not in before)
    assert root.parent_id == "" and len(root.trace_id) == 32
    job = next(s for s in receiver.wait_for({"worker.job"}, root.trace_id) if s.name == "worker.job")
    assert job.parent_id == root.span_id


def test_embeddings_and_speech_jobs_are_traced_the_same_way(traced: Tiers, receiver: Receiver) -> None:
    trace, headers = _client_trace()
    response = httpx.post(f"{traced.base_url}/embeddings", timeout=60, headers=headers,
                          json={"model": EMBED, "input": ["the cat", "a dog"]})
    assert response.status_code == 200
    spans = receiver.wait_for({"POST /v3/embeddings", *API_PHASES, "worker.job", "worker.admit", "embed.batch",
                               "worker.publish"}, trace)
    by_name, _, job = _tree(spans, "POST /v3/embeddings", trace)
    assert by_name["embed.batch"].parent_id == job.span_id and by_name["embed.batch"].attributes["ovq.batch_jobs"] == 1
    assert job.attributes["gen_ai.usage.input_tokens"] == response.json()["usage"]["prompt_tokens"]

    other_trace, headers = _client_trace()
    wav = io.BytesIO()
    soundfile.write(wav, np.zeros(16_000, dtype=np.float32), 16_000, format="WAV")
    response = httpx.post(f"{traced.base_url}/audio/transcriptions", timeout=60, headers=headers,
                          data={"model": WHISPER}, files={"file": ("a.wav", wav.getvalue())})
    assert response.status_code == 200
    spans = receiver.wait_for({"worker.job", "speech.transcribe", "worker.publish"}, other_trace)
    by_name = {s.name: s for s in spans}
    assert by_name["speech.transcribe"].parent_id == by_name["worker.job"].span_id
