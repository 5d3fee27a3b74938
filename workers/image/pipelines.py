"""OpenVINO GenAI image pipelines for one model directory: text-to-image, and for edits image-to-image and
inpainting built from the same directory when first needed. `generate()` releases the GIL, so it runs in a
thread of the worker's I/O process; the step callback is how progress leaves it and cancels reach it."""
from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from common.jobs import ImageParams
from common.modelcard import ImageLimits
from common.models.config import ModelConfig, parse_size

StepCallback = Callable[[int, int, Any], bool]
PREVIEW_MAX = 128
# Approximate RGB of Stable Diffusion 1.x/2.x latents: a cheap preview without running the VAE decoder.
SD_LATENT_RGB = np.array(
    [[0.3512, 0.2297, 0.3227], [0.3250, 0.4974, 0.2350], [-0.2829, 0.1762, 0.2721], [-0.2120, -0.2616, -0.7177]],
    dtype=np.float32,
)
GENERATE_FIELDS = ("num_inference_steps", "guidance_scale", "negative_prompt", "prompt_2", "prompt_3",
                   "negative_prompt_2", "negative_prompt_3", "max_sequence_length", "rng_seed", "strength")


def image_limits(model: ModelConfig, path: Path) -> ImageLimits:
    index = json.loads((path / "model_index.json").read_text())
    return ImageLimits(
        max_resolution=model.max_resolution,
        default_resolution=model.default_resolution,
        max_num_images_per_prompt=model.max_num_images_per_prompt,
        default_num_inference_steps=model.default_num_inference_steps,
        max_num_inference_steps=model.max_num_inference_steps,
        pipeline=str(index.get("_class_name", "")),
        edits=(path / "vae_encoder").exists(),
        lora_adapters=sorted(model.lora_adapters),
    )


def to_png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_image(data: bytes, size: tuple[int, int] | None, mode: str = "RGB") -> np.ndarray:
    """Uploaded bytes -> uint8 [1, H, W, 3], resized to `size` (W, H) when given."""
    image = Image.open(io.BytesIO(data)).convert(mode).convert("RGB")
    if size and image.size != size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    return np.asarray(image, dtype=np.uint8)[None]


def latent_preview(latent: Any) -> bytes:
    """A small PNG of what the latent looks like so far (SD-family 4-channel latents in colour, else grey)."""
    data = np.asarray(latent.data if hasattr(latent, "data") else latent, dtype=np.float32)
    if data.ndim != 4:
        data = data.reshape(1, 1, 1, -1)
    channels = data[0]
    if channels.shape[0] == 4:
        rgb = np.einsum("chw,cr->hwr", channels, SD_LATENT_RGB)
    else:
        grey = channels.mean(axis=0)
        rgb = np.repeat(grey[..., None], 3, axis=2)
    pixels = np.clip((rgb + 1.0) * 127.5, 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    image.thumbnail((PREVIEW_MAX, PREVIEW_MAX))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class ImagePipelines:
    def __init__(self, model: ModelConfig, device: str) -> None:
        self.path, self.device = str(model.path), device
        self.properties = dict(model.plugin_config)
        self.default_size = parse_size(model.default_resolution) if model.default_resolution else None
        self.default_steps = model.default_num_inference_steps
        self._pipes: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._adapters: dict[str, Any] = {}  # name -> openvino_genai.Adapter, loaded once
        self._alphas = {name: adapter.alpha for name, adapter in model.lora_adapters.items()}
        self._paths = {name: str(adapter.path) for name, adapter in model.lora_adapters.items()}

    def adapter_config(self, weights: dict[str, float] | None) -> Any:
        """All the adapters with these weights (unnamed ones 0; None: the models file's alphas). Dynamic mode:
        GenAI's default for image pipelines fuses the adapters into the weights at construction, after which a
        generate() call's own weights are silently ignored."""
        import openvino_genai as g

        if not self._adapters:
            self._adapters = {name: g.Adapter(path) for name, path in self._paths.items()}
        chosen = self._alphas if weights is None else {name: weights.get(name, 0.0) for name in self._alphas}
        pairs = [(self._adapters[name], float(weight)) for name, weight in chosen.items()]
        return g.AdapterConfig(pairs, g.AdapterConfig.Mode.MODE_DYNAMIC)

    def pipe(self, kind: str) -> Any:
        """The pipeline of a kind, built once (edits build theirs on the first edit)."""
        import openvino_genai as g

        with self._lock:
            if kind not in self._pipes:
                factory = {"text": g.Text2ImagePipeline, "image": g.Image2ImagePipeline,
                           "inpaint": g.InpaintingPipeline}[kind]
                adapters = {"adapters": self.adapter_config(None)} if self._paths else {}
                self._pipes[kind] = factory(self.path, self.device, **adapters, **self.properties)
            return self._pipes[kind]

    def generate(self, prompt: str, params: ImageParams, image: np.ndarray | None, mask: np.ndarray | None,
                 callback: StepCallback) -> np.ndarray:
        """uint8 [n, H, W, 3]; empty when the callback cancelled it."""
        import openvino as ov

        kwargs: dict[str, Any] = {k: getattr(params, k) for k in GENERATE_FIELDS if getattr(params, k) is not None}
        kwargs.setdefault("num_inference_steps", self.default_steps)
        kwargs["num_images_per_prompt"] = params.n
        if self._paths and params.lora_weights is not None:
            kwargs["adapters"] = self.adapter_config(params.lora_weights)
        size = (params.width, params.height) if params.width and params.height else self.default_size
        if image is None:
            kwargs.pop("strength", None)
            if size:
                kwargs["width"], kwargs["height"] = size
            result = self.pipe("text").generate(prompt, callback=callback, **kwargs)
        elif mask is None:
            result = self.pipe("image").generate(prompt, ov.Tensor(image), callback=callback, **kwargs)
        else:
            result = self.pipe("inpaint").generate(prompt, ov.Tensor(image), ov.Tensor(mask), callback=callback,
                                                   **kwargs)
        return np.array(result.data)  # a copy: the pipeline reuses its buffer on the next generate
