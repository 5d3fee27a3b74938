"""The encoder worker's batching rule and result encoding."""
from __future__ import annotations

import asyncio
import base64
from collections import deque
from pathlib import Path

import numpy as np

from common.jobs import EmbedParams, Job
from common.models.config import ModelConfig
from common.settings import Settings
from workers.embed.worker import EncoderJob, EncoderWorker, encode_vectors, take_batch
from workers.queue.publisher import Outbox


def waiting(*shapes: tuple[int, int] | None) -> deque[EncoderJob]:
    """Jobs of (texts, tokens each); None: not tokenized yet."""
    jobs = deque()
    for n, shape in enumerate(shapes):
        job = Job(id=str(n), model="m", device="CPU", kind="embed", prompt="", reply_to="api",
                  embed=EmbedParams(inputs=["x"]))
        state = EncoderJob(job, b"1-0")
        if shape is not None:
            count, length = shape
            state.texts, state.lengths = ["x"] * count, [length] * count
        jobs.append(state)
    return jobs


def ids(batch: list[EncoderJob]) -> list[str]:
    return [s.job.id for s in batch]


def test_batch_fits_the_padded_token_budget() -> None:
    queue = waiting((2, 10), (1, 30), (4, 5), (1, 10))
    # 2x10=20, then 3x30=90 fits 100, then 7x30=210 does not.
    assert ids(take_batch(queue, 100)) == ["0", "1"]
    assert ids(take_batch(queue, 100)) == ["2", "3"]
    assert not queue


def test_budget_one_takes_one_job_and_a_big_job_goes_alone() -> None:
    queue = waiting((1, 5), (1, 5))
    assert ids(take_batch(queue, 1)) == ["0"]
    assert ids(take_batch(waiting((50, 100), (1, 1)), 10)) == ["0"]


def test_jobs_not_yet_tokenized_wait_for_the_next_turn() -> None:
    queue = waiting((1, 5), None, (1, 5))
    assert ids(take_batch(queue, 1000)) == ["0"]
    assert ids(take_batch(queue, 1000)) == []
    assert len(queue) == 2


def test_vectors_travel_as_little_endian_float32_base64() -> None:
    vectors = np.asarray([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32)
    encoded = encode_vectors(vectors)
    assert [np.frombuffer(base64.b64decode(e), dtype="<f4").tolist() for e in encoded] == vectors.tolist()


# ---- the worker itself, on the tiny models, its publisher not started (what it would send is read off its queue) --

MODELS = Path(__file__).resolve().parents[3] / "models"


def worker_for(name: str, **options: object) -> EncoderWorker:
    model = ModelConfig(name=name, path=MODELS / name, **options)
    return EncoderWorker(Settings(redis_url="redis://127.0.0.1:1"), model, "CPU")


def sent(worker: EncoderWorker) -> list[dict]:
    """Every event the worker handed its publisher so far, in order."""
    events = []
    while not worker.publisher._queue.empty():
        outbox = worker.publisher._queue.get_nowait()
        events += [event for batch in outbox.events.values() for event in batch]
    return events


def job(n: int, inputs: list, kind: str = "embed", **params: object) -> Job:
    return Job(id=f"j{n}", model="m", device="CPU", kind=kind, prompt="", reply_to="api",
               embed=EmbedParams(inputs=inputs, **params))


async def test_waiting_jobs_run_as_one_batch_and_get_their_own_vectors() -> None:
    import openvino_genai as g

    worker = worker_for("tiny-embed", max_position_embeddings=8)
    await asyncio.to_thread(worker.pipes.load)
    texts = [["the cat"], ["a dog", "the sun"], ["the quick brown fox jumps over the lazy dog"]]
    for n, inputs in enumerate(texts):
        worker._start(f"{n}-0".encode(), job(n, inputs, dimensions=8 if n == 1 else None), Outbox())
    await worker._prepare(list(worker.waiting))
    batch = take_batch(worker.waiting, worker.budget)
    assert [s.job.id for s in batch] == ["j0", "j1"]  # j2 was over the 8-token context: refused, not batched
    await worker._run(batch)
    events = {e["job"]: e for e in sent(worker) if e["type"] != "accepted"}
    assert events["j2"]["type"] == "error" and events["j2"]["status"] == 400
    assert "more than the model's 8" in events["j2"]["error"]["message"]
    own = np.asarray(g.TextEmbeddingPipeline(str(MODELS / "tiny-embed"), "CPU").embed_documents(
        ["the cat", "a dog", "the sun"]), dtype=np.float32)
    vectors = [np.frombuffer(base64.b64decode(v), dtype="<f4") for v in events["j0"]["embeddings"]]
    np.testing.assert_allclose(vectors[0], own[0], atol=1e-6)
    cut = [np.frombuffer(base64.b64decode(v), dtype="<f4") for v in events["j1"]["embeddings"]]
    assert [len(v) for v in cut] == [8, 8]
    np.testing.assert_allclose(cut[1], own[2][:8] / np.linalg.norm(own[2][:8]), atol=1e-6)
    assert events["j1"]["usage"]["prompt_tokens"] == sum(worker.pipes.lengths(["a dog", "the sun"]))
    assert not worker.running


async def test_a_job_cancelled_while_it_waits_ends_at_once() -> None:
    worker = worker_for("tiny-embed")
    admitted = Outbox()  # what admission sends: each job's `accepted`
    worker._start(b"1-0", job(1, ["x"]), admitted)
    worker._start(b"2-0", job(2, ["y"]), admitted)
    assert [e["type"] for e in admitted.events["api"]] == ["accepted", "accepted"]
    worker.cancel("j1")
    assert [s.job.id for s in worker.waiting] == ["j2"] and list(worker.running) == ["j2"]
    (cancelled,) = sent(worker)
    assert (cancelled["job"], cancelled["type"]) == ("j1", "cancelled")


async def test_rerank_batches_by_query_and_scores_each_document() -> None:
    worker = worker_for("tiny-rerank")
    await asyncio.to_thread(worker.pipes.load)
    worker._start(b"1-0", job(1, ["a cat", "the sky"], kind="rerank", query="cat"), Outbox())
    worker._start(b"2-0", job(2, ["a dog"], kind="rerank", query="dog"), Outbox())
    worker._start(b"3-0", job(3, ["the sun"], kind="rerank", query="cat"), Outbox())
    await worker._prepare(list(worker.waiting))
    await worker._run(take_batch(worker.waiting, worker.budget))
    scores = {e["job"]: e["scores"] for e in sent(worker) if e["type"] == "done"}
    assert scores == {"j1": worker.pipes.rerank("cat", ["a cat", "the sky"]),
                      "j2": worker.pipes.rerank("dog", ["a dog"]), "j3": worker.pipes.rerank("cat", ["the sun"])}


async def test_an_input_the_tokenizer_cannot_take_fails_only_its_job() -> None:
    worker = worker_for("tiny-embed")
    await asyncio.to_thread(worker.pipes.load)
    worker._start(b"1-0", job(1, [[2**70]]), Outbox())
    worker._start(b"2-0", job(2, ["the cat"]), Outbox())
    await worker._prepare(list(worker.waiting))
    await worker._run(take_batch(worker.waiting, worker.budget))
    events = {e["job"]: e for e in sent(worker)}
    assert events["j1"]["status"] == 400 and "could not be tokenized" in events["j1"]["error"]["message"]
    assert events["j2"]["type"] == "done" and len(events["j2"]["embeddings"]) == 1
