"""Fair shares' pure parts: what counts as in flight, a job's estimated tokens, the parked count per tenant."""
from __future__ import annotations

from common.fairness import DEFAULT_OUTPUT_TOKENS, PARK, estimate_cost, in_flight, tenant_counts
from common.jobs import EmbedParams, Job, SamplingParams


def test_parked_jobs_are_waiting_not_in_flight() -> None:
    summary = {"pending": 7, "consumers": [{"name": PARK.encode(), "pending": 5}, {"name": b"w1", "pending": 2}]}
    assert in_flight(summary) == 2
    assert in_flight({"pending": 3, "consumers": [{"name": "w1", "pending": 3}]}) == 3
    assert in_flight({"pending": 0, "min": None, "max": None, "consumers": []}) == 0


def test_a_jobs_cost_is_its_prompt_and_expected_output() -> None:
    def job(**fields: object) -> Job:
        return Job(model="m", device="CPU", reply_to="api", **{"kind": "completion", "prompt": "x", **fields})

    assert estimate_cost(job(prompt=[1, 2, 3], params=SamplingParams(max_tokens=10))) == 13
    assert estimate_cost(job(prompt="a" * 40, params=SamplingParams(max_tokens=10, n=2))) == 11 + 20
    assert estimate_cost(job(prompt=[1])) == 1 + DEFAULT_OUTPUT_TOKENS
    assert estimate_cost(job(kind="embed", prompt="", embed=EmbedParams(inputs=[[1, 2], "abcd"]))) == 4


def test_tenant_counts_read_the_clocks_n_fields() -> None:
    clock = {b"v": b"10", b"f:a": b"20", b"n:a": b"3", b"n:": b"1", b"n:b": b"0"}
    assert tenant_counts(clock) == {"a": 3, "(none)": 1}


def test_a_video_costs_its_work_not_one_request() -> None:
    from common.fairness import estimate_cost, video_work
    from common.jobs import Job, VideoParams

    params = VideoParams(width=704, height=480, num_frames=105, frame_rate=25, num_inference_steps=25, ttl_s=60)
    assert video_work(params) == 25 * 14 * 22 * 15  # steps x latent frames x latent tokens per frame
    job = Job(model="m", device="CPU", kind="video", prompt="a cat", video=params, reply_to="r")
    assert estimate_cost(job) == video_work(params)
    assert video_work(params.model_copy(update={"num_inference_steps": 50})) == 2 * video_work(params)
