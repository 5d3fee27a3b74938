"""OVMS's /tokenize on a served model: the ids its own tokenizer gives, a 404 for a model nobody serves, a 400
for an image model."""
from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import IMAGE, MODEL, Stack


def test_tokenize_gives_the_models_own_ids(stack: Stack, model_dir: Path) -> None:
    import openvino_genai

    tokenizer = openvino_genai.Tokenizer(str(model_dir))
    text = "What is the capital of France?"
    expected = tokenizer.encode(text).input_ids.data[0].tolist()
    for prefix in ("/v3", "/v1"):
        answer = httpx.post(stack.url(f"{prefix}/tokenize"), json={"model": MODEL, "text": text}, timeout=60)
        assert answer.status_code == 200 and answer.json() == {"tokens": expected}
    several = httpx.post(stack.url("/v3/tokenize"), timeout=60, json={
        "model": MODEL, "text": [text, "hi"], "max_length": 4, "pad_to_max_length": True, "padding_side": "left"})
    pad = max(tokenizer.get_pad_token_id(), 0)
    short = tokenizer.encode("hi").input_ids.data[0].tolist()
    assert several.json() == {"tokens": [expected[:4], [pad] * (4 - len(short)) + short]}


def test_tokenize_refuses_unknown_and_image_models(stack: Stack) -> None:
    unknown = httpx.post(stack.url("/v3/tokenize"), json={"model": "nobody", "text": "x"}, timeout=60)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    image = httpx.post(stack.url("/v3/tokenize"), json={"model": IMAGE, "text": "x"}, timeout=60)
    assert image.status_code == 400 and "image generation" in image.json()["error"]["message"]
    bad = httpx.post(stack.url("/v3/tokenize"), json={"model": MODEL, "text": 5}, timeout=60)
    assert bad.status_code == 400
