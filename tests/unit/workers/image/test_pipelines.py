"""workers/image/pipelines.py: what the image worker does to pixels around the pipeline."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from workers.image.pipelines import decode_image, latent_preview, to_png


def test_latent_preview_is_a_small_png() -> None:
    for shape in ((1, 4, 8, 8), (1, 16, 300, 200)):
        preview = Image.open(io.BytesIO(latent_preview(np.random.default_rng(0).normal(size=shape))))
        assert preview.format == "PNG" and max(preview.size) <= 128


def test_uploads_are_decoded_and_resized() -> None:
    pixels = decode_image(to_png(np.zeros((10, 20, 3), dtype=np.uint8)), (32, 16))
    assert pixels.shape == (1, 16, 32, 3) and pixels.dtype == np.uint8
    mask = decode_image(to_png(np.full((10, 20, 3), 255, dtype=np.uint8)), None, mode="L")
    assert mask.shape == (1, 10, 20, 3) and mask.min() == 255
