"""api/openai/images.py: an image request checked against the model's OVMS image options."""
from __future__ import annotations

import pytest

from api.openai.images import check_limits
from api.openai.protocol import ImageRequest
from common.errors import OvqError
from common.modelcard import ImageLimits
from common.models.config import parse_size

LIMITS = ImageLimits(max_resolution="512x256", max_num_images_per_prompt=2, default_num_inference_steps=50,
                     max_num_inference_steps=100)


def request(**fields: object) -> ImageRequest:
    return ImageRequest(model="m", prompt="p", **fields)


def test_sizes() -> None:
    assert parse_size("64x32") == (64, 32)
    for bad in ("64", "x", "0x5", "-1x5", "axb", "64x64x2"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_limits_follow_ovms_node_options() -> None:
    assert check_limits(request(size="512x256", n=2, num_inference_steps=100), LIMITS) == (512, 256)
    assert check_limits(request(size="auto"), LIMITS) == (None, None)
    for fields, param in (({"size": "513x8"}, "size"), ({"size": "8x257"}, "size"), ({"n": 3}, "n"),
                          ({"num_inference_steps": 101}, "num_inference_steps"), ({"size": "1k"}, "size")):
        with pytest.raises(OvqError) as caught:
            check_limits(request(**fields), LIMITS)
        assert caught.value.status == 400 and caught.value.body.param == param


def test_lora_weights_name_served_adapters_and_come_as_json_in_forms() -> None:
    from api.openai.images import check_lora_weights

    check_lora_weights(request(lora_weights={"style": 0.5}), ["style"])
    check_lora_weights(request(), [])
    assert request(lora_weights='{"style": 0.25}').lora_weights == {"style": 0.25}  # an edit's form field
    for weights, adapters, message in (({"other": 1.0}, ["style"], "serves no LoRA adapter 'other'"),
                                       ({"style": 1.0}, [], "it serves: none"),
                                       ({"style": float("nan")}, ["style"], "not a finite number")):
        with pytest.raises(OvqError, match=message) as caught:
            check_lora_weights(request(lora_weights=weights), adapters)
        assert caught.value.body.param == "lora_weights"
    with pytest.raises(ValueError, match="JSON object"):
        request(lora_weights="{nope")
