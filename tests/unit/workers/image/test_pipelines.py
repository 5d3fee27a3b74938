"""workers/image/pipelines.py: what the image worker does to pixels around the pipeline."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from tests.precision import F32
from workers.image.pipelines import ImagePipelines, decode_image, latent_preview, to_png


def test_latent_preview_is_a_small_png() -> None:
    for shape in ((1, 4, 8, 8), (1, 16, 300, 200)):
        preview = Image.open(io.BytesIO(latent_preview(np.random.default_rng(0).normal(size=shape))))
        assert preview.format == "PNG" and max(preview.size) <= 128


def test_uploads_are_decoded_and_resized() -> None:
    pixels = decode_image(to_png(np.zeros((10, 20, 3), dtype=np.uint8)), (32, 16))
    assert pixels.shape == (1, 16, 32, 3) and pixels.dtype == np.uint8
    mask = decode_image(to_png(np.full((10, 20, 3), 255, dtype=np.uint8)), None, mode="L")
    assert mask.shape == (1, 10, 20, 3) and mask.min() == 255


def test_lora_weights_per_request_match_genai_with_the_same_adapter() -> None:
    """tiny-sd with tests/models/tiny-sd-lora: the adapter changes the image; each request's weight gives exactly
    what GenAI's own pipeline built with that adapter and alpha gives; weight 0 is the base model. At f32, pinned:
    in bf16 an adapter weighted 0 still rounds the UNet's sums differently from a pipeline without it."""
    import openvino_genai as g

    from common.jobs import ImageParams
    from common.models.config import LoraAdapter, ModelConfig

    models = Path(__file__).parents[3] / "models"
    adapter = models / "tiny-sd-lora" / "tiny_sd_lora.safetensors"
    config = ModelConfig(name="sd", path=models / "tiny-sd", lora_adapters={"style": LoraAdapter(path=adapter)},
                         plugin_config=F32)
    pipes = ImagePipelines(config, "CPU")
    settings = {"width": 64, "height": 64, "num_inference_steps": 2, "rng_seed": 7}

    def ours(weights: dict[str, float] | None) -> np.ndarray:
        params = ImageParams(width=64, height=64, num_inference_steps=2, rng_seed=7, lora_weights=weights)
        return pipes.generate("a red cat", params, None, None, lambda *_: False).copy()  # a view of GenAI's buffer

    def genai(alpha: float | None) -> np.ndarray:
        adapters = {} if alpha is None else {"adapters": g.AdapterConfig([(g.Adapter(str(adapter)), alpha)],
                                                                         g.AdapterConfig.Mode.MODE_DYNAMIC)}
        pipe = g.Text2ImagePipeline(str(models / "tiny-sd"), "CPU", **adapters, **F32)
        return np.array(pipe.generate("a red cat", **settings).data)

    base, full, half = genai(None), genai(1.0), genai(0.5)
    assert np.abs(full.astype(int) - base).mean() > 0.1 and np.abs(half.astype(int) - full).mean() > 0.1
    assert np.array_equal(ours(None), full)  # the models file's alpha (1.0)
    assert np.array_equal(ours({"style": 0.5}), half)
    assert np.array_equal(ours({}), base)  # adapters not named weigh 0
    assert np.array_equal(ours(None), full)  # a request's weights do not stick to the pipeline
