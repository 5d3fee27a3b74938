"""Image generation and edits through the queue, with the official openai SDK, on a tiny random-weight SD."""
from __future__ import annotations

import base64
import io
import time

import httpx
import openai
import pytest
import redis
from openai import OpenAI
from PIL import Image

from common.keys import GROUP
from tests.conftest import IMAGE, MODEL, Stack, test_keys

KEYS = test_keys("ovqtest")


def png(b64: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return image


def upload(size: tuple[int, int], colour: tuple[int, int, int] | int = (200, 30, 30), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_generation_returns_png_of_the_requested_size(client: OpenAI) -> None:
    result = client.images.generate(model=IMAGE, prompt="a red square", size="64x64", response_format="b64_json",
                                    extra_body={"num_inference_steps": 2})
    assert result.created > 0
    assert png(result.data[0].b64_json).size == (64, 64)


def test_same_seed_same_bytes_and_n_images(client: OpenAI) -> None:
    def make(seed: int, n: int = 1) -> list[str]:
        result = client.images.generate(model=IMAGE, prompt="a cat", size="64x64", n=n,
                                        extra_body={"rng_seed": seed, "num_inference_steps": 2})
        return [d.b64_json for d in result.data]

    assert make(7) == make(7)
    assert make(7) != make(8)
    two = make(3, n=2)
    assert len(two) == 2 and all(png(b).size == (64, 64) for b in two)


@pytest.mark.parametrize(
    ("extra", "param", "text"),
    [
        ({"n": 4}, "n", "exceeds max_num_images_per_prompt (3)"),
        ({"size": "512x64"}, "size", "exceeds max_resolution 256x256"),
        ({"size": "big"}, "size", "WIDTHxHEIGHT"),
        ({"num_inference_steps": 101}, "num_inference_steps", "exceeds max_num_inference_steps (100)"),
        ({"response_format": "url"}, "response_format", ""),
        ({"style": "vivid"}, "style", "unsupported field"),
        ({"prompt": ""}, "prompt", ""),
        ({"lora_weights": {"style": 0.5}}, "lora_weights", "serves no LoRA adapter 'style' (it serves: none)"),
    ],
)
def test_limit_violations_are_400s(stack: Stack, extra: dict, param: str, text: str) -> None:
    body = {"model": IMAGE, "prompt": "x", "size": "64x64", **extra}
    response = httpx.post(f"{stack.base_url}/images/generations", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"]


def test_wrong_kind_of_model_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="does not generate images"):
        client.images.generate(model=MODEL, prompt="x")
    with pytest.raises(openai.BadRequestError, match="does not generate text"):
        client.chat.completions.create(model=IMAGE, messages=[{"role": "user", "content": "x"}])


def test_streamed_generation_sends_a_progress_event_per_step_then_the_image(client: OpenAI) -> None:
    stream = client.images.generate(model=IMAGE, prompt="a boat", size="64x64", stream=True,
                                    extra_body={"num_inference_steps": 4})
    events = list(stream)
    partial = [e for e in events if e.type == "image_generation.partial_image"]
    completed = [e for e in events if e.type == "image_generation.completed"]
    assert [e.partial_image_index for e in partial] == [0, 1, 2, 3]
    previews = [png(e.b64_json) for e in partial]  # the latent, previewed without the VAE
    assert all(p.size[0] == p.size[1] and 0 < p.size[0] < 64 for p in previews)
    assert len(completed) == 1 and png(completed[0].b64_json).size == (64, 64)
    assert events[-1] is completed[0]


def test_closing_an_image_stream_cancels_the_generation(client: OpenAI, redis_client: redis.Redis) -> None:
    stream = client.images.generate(model=IMAGE, prompt="slow", size="64x64", stream=True,
                                    extra_body={"num_inference_steps": 100})
    seen = 0
    for _ in stream:
        seen += 1
        if seen == 2:
            break
    stream.close()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and redis_client.xpending(KEYS.jobs(IMAGE, "CPU"), GROUP)["pending"]:
        time.sleep(0.02)
    assert redis_client.xpending(KEYS.jobs(IMAGE, "CPU"), GROUP)["pending"] == 0
    result = client.images.generate(model=IMAGE, prompt="next", size="64x64", extra_body={"num_inference_steps": 1})
    assert png(result.data[0].b64_json).size == (64, 64)


def test_edit_with_image_and_with_mask(client: OpenAI) -> None:
    edited = client.images.edit(model=IMAGE, image=("in.png", upload((64, 64))), prompt="make it blue",
                                extra_body={"strength": 0.5, "num_inference_steps": 2})
    assert png(edited.data[0].b64_json).size == (64, 64)
    mask = ("mask.png", upload((64, 64), 255, mode="L"))
    inpainted = client.images.edit(model=IMAGE, image=("in.png", upload((64, 64))), mask=mask, prompt="a hole",
                                   size="64x64", extra_body={"num_inference_steps": 2})
    assert png(inpainted.data[0].b64_json).size == (64, 64)


def test_bad_uploads_are_400s(stack: Stack) -> None:
    def edit(files: dict, data: dict | None = None) -> httpx.Response:
        form = {"model": IMAGE, "prompt": "x", **(data or {})}
        return httpx.post(f"{stack.base_url}/images/edits", data=form, files=files, timeout=30)

    assert edit({"image": ("a.png", b"not an image")}).status_code == 400
    bomb = upload((5000, 5000), 0, mode="L")  # small on the wire, 25 Mpx decoded
    response = edit({"image": ("bomb.png", bomb)})
    assert response.status_code == 400 and "pixels" in response.json()["error"]["message"]
    response = edit({"image": ("a.png", upload((64, 64)))}, {"strength": "1.5"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "strength"
    assert edit({"mask": ("m.png", upload((64, 64), 255, mode="L"))}).json()["error"]["param"] == "image"
    assert edit({}).status_code == 415  # not multipart
