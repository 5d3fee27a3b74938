"""The encoder worker's batching rule and result encoding."""
from __future__ import annotations

import base64
from collections import deque

import numpy as np

from common.jobs import EmbedParams, Job
from workers.embed.worker import EncoderJob, encode_vectors, take_batch


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
