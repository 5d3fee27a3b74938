"""MP4 and thumbnail encoding, decoded back."""
from __future__ import annotations

import io

import av
import numpy as np
from PIL import Image

from workers.video.pipelines import encode_mp4, thumbnail


def test_mp4_is_h264_with_every_frame_at_the_rate() -> None:
    frames = (np.random.default_rng(0).random((17, 64, 96, 3)) * 255).astype(np.uint8)
    with av.open(io.BytesIO(encode_mp4(frames, 8))) as container:
        stream = container.streams.video[0]
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 96, 64)
        assert float(stream.average_rate) == 8 and len(decoded) == 17


def test_thumbnail_is_the_first_frame_as_webp() -> None:
    frame = np.full((64, 96, 3), (200, 30, 30), dtype=np.uint8)
    image = Image.open(io.BytesIO(thumbnail(frame)))
    assert (image.format, image.size) == ("WEBP", (96, 64))
    assert np.abs(np.asarray(image.convert("RGB"), dtype=int) - frame).mean() < 8
