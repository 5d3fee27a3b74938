from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from api.openai.images import check_limits
from api.openai.protocol import ImageRequest
from common.errors import OvqError
from common.modelcard import ImageLimits
from common.models.config import parse_size
from workers.image.pipelines import decode_image, latent_preview, to_png

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


def test_latent_preview_is_a_small_png() -> None:
    for shape in ((1, 4, 8, 8), (1, 16, 300, 200)):
        preview = Image.open(io.BytesIO(latent_preview(np.random.default_rng(0).normal(size=shape))))
        assert preview.format == "PNG" and max(preview.size) <= 128


def test_uploads_are_decoded_and_resized() -> None:
    pixels = decode_image(to_png(np.zeros((10, 20, 3), dtype=np.uint8)), (32, 16))
    assert pixels.shape == (1, 16, 32, 3) and pixels.dtype == np.uint8
    mask = decode_image(to_png(np.full((10, 20, 3), 255, dtype=np.uint8)), None, mode="L")
    assert mask.shape == (1, 10, 20, 3) and mask.min() == 255
