"""OpenVINO GenAI's Text2VideoPipeline for one model directory, and the encoding of its frames.

`generate()` releases the GIL, so it runs in a thread of the worker's I/O process; the step callback is how progress
leaves it and cancels reach it. Frames are encoded to MP4 (H.264, yuv420p: what every browser and player takes) by
PyAV, whose wheel carries FFmpeg with libx264; the thumbnail is the first frame as WebP (OpenAI's variant).
"""
from __future__ import annotations

import io
import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from common.jobs import VideoParams
from common.modelcard import VideoLimits
from common.models.config import ModelConfig

StepCallback = Callable[[int, int, Any], bool]
# LTX-Video's VAE packs 8 frames into one latent frame after the first: a clip has 8k+1 frames.
FRAMES_PER_LATENT = 8
DEFAULT_FRAME_RATE = 25
MAX_SECONDS = 20


def video_limits(model: ModelConfig, path: Path) -> VideoLimits:
    index = json.loads((path / "model_index.json").read_text())
    return VideoLimits(
        max_resolution=model.max_resolution,
        default_resolution=model.default_resolution,
        default_num_inference_steps=model.default_num_inference_steps,
        max_num_inference_steps=model.max_num_inference_steps,
        max_seconds=MAX_SECONDS,
        default_seconds=4,
        frame_rate=DEFAULT_FRAME_RATE,
        pipeline=str(index.get("_class_name", "")),
    )


def encode_mp4(frames: np.ndarray, frame_rate: int) -> bytes:
    """uint8 [frames, H, W, 3] -> an H.264 MP4 at `frame_rate` (H and W even: yuv420p halves the chroma)."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(frame_rate))
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "23", "preset": "veryfast"}
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def thumbnail(frame: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="WEBP", quality=80)
    return buffer.getvalue()


class VideoPipeline:
    def __init__(self, model: ModelConfig, device: str) -> None:
        self.path, self.device = str(model.path), device
        self.properties = dict(model.plugin_config)
        self._pipe: Any = None

    def load(self) -> None:
        import openvino_genai as g

        if self._pipe is None:
            self._pipe = g.Text2VideoPipeline(self.path, self.device, **self.properties)

    def generate(self, prompt: str, params: VideoParams, callback: StepCallback) -> tuple[np.ndarray, dict[str, float]]:
        """uint8 [frames, H, W, 3] (empty when the callback cancelled it), and where the time went (ms): encoding
        the prompt, denoising, decoding the latents to frames."""
        import openvino_genai as g

        self.load()
        kwargs: dict[str, Any] = {"height": params.height, "width": params.width, "num_frames": params.num_frames,
                                  "num_inference_steps": params.num_inference_steps,
                                  "frame_rate": params.frame_rate, "num_videos_per_prompt": 1}
        for name in ("guidance_scale", "negative_prompt"):
            if getattr(params, name) is not None:
                kwargs[name] = getattr(params, name)
        if params.rng_seed is not None:  # the same seed, the same video (a remix keeps its source's)
            kwargs["generator"] = g.CppStdGenerator(params.rng_seed)
        result = self._pipe.generate(prompt, callback=callback, **kwargs)
        video = np.array(result.video.data)  # a copy: the pipeline reuses its buffer on the next generate
        frames = video[0] if video.ndim == 5 else np.empty((0, 0, 0, 3), dtype=np.uint8)  # cancelled: no frames
        return frames, phases(result.perf_metrics)


def phases(metrics: Any) -> dict[str, float]:
    """GenAI's own timings of one generate() (ms): the rest of it, after the text encoders and the VAE, is the
    denoising loop."""
    total = float(metrics.get_generate_duration())
    text = float(sum(metrics.get_text_encoder_infer_duration().values()))
    vae = float(metrics.get_vae_decoder_infer_duration())
    return {"text_encode_ms": round(text, 1), "denoise_ms": round(total - text - vae, 1),
            "vae_decode_ms": round(vae, 1)}
