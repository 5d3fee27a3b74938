"""A video request within the model's limits: frames, size, seconds, steps and the seed a remix reuses."""
from __future__ import annotations

import pytest

from api.openai.videos.protocol import VideoRequest
from api.openai.videos.serving import video_params
from common.errors import OvqError
from common.modelcard import VideoLimits

LIMITS = VideoLimits(max_resolution="768x512", default_num_inference_steps=20, max_num_inference_steps=50,
                     max_seconds=8, default_seconds=4, frame_rate=25, pipeline="LTXPipeline")


def test_defaults_and_frames_of_8k_plus_1_covering_the_seconds() -> None:
    seconds, params = video_params(VideoRequest(prompt="x"), LIMITS, 600)
    assert (seconds, params.width, params.height, params.num_inference_steps) == (4, 704, 480, 20)
    assert (params.num_frames, params.frame_rate) == (105, 25)  # 100 frames asked, 8 x 13 + 1 made
    assert params.rng_seed is not None and params.ttl_s == 600
    _, short = video_params(VideoRequest(prompt="x", seconds=1, frame_rate=8, seed=3), LIMITS, 600)
    assert (short.num_frames, short.rng_seed) == (9, 3)


@pytest.mark.parametrize(("fields", "param"), [({"size": "700x480"}, "size"), ({"size": "800x512"}, "size"),
                                               ({"seconds": 9}, "seconds"), ({"num_inference_steps": 51},
                                                                             "num_inference_steps")])
def test_over_the_limits_is_a_400_naming_the_field(fields: dict, param: str) -> None:
    with pytest.raises(OvqError) as refused:
        video_params(VideoRequest(prompt="x", **fields), LIMITS, 600)
    assert (refused.value.status, refused.value.body.param) == (400, param)


def test_seconds_as_the_sdk_sends_them() -> None:
    assert VideoRequest.model_validate({"prompt": "x", "seconds": "8"}).seconds == 8
