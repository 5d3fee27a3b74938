"""/tokenize's shaping (OVMS's max_length, pad_to_max_length, padding_side) and encoding with a real tokenizer."""
from __future__ import annotations

from pathlib import Path

import pytest

from api.openai.tokenize import TokenizeRequest, Tokenizers, shaped
from common.errors import OvqError
from common.settings import Settings

LLAMA = Path(__file__).resolve().parents[3] / "models" / "tiny-llama"


def test_shaping_cuts_and_pads_as_asked() -> None:
    def body(**options: object) -> TokenizeRequest:
        return TokenizeRequest(model="m", text="x", **options)

    assert shaped([1, 2, 3], body(), 0) == [1, 2, 3]
    assert shaped([1, 2, 3], body(max_length=2), 0) == [1, 2]
    assert shaped([1, 2, 3], body(max_length=5), 0) == [1, 2, 3]
    assert shaped([1, 2, 3], body(max_length=5, pad_to_max_length=True), 9) == [1, 2, 3, 9, 9]
    assert shaped([1, 2, 3], body(max_length=5, pad_to_max_length=True, padding_side="left"), 9) == [9, 9, 1, 2, 3]


def test_encoding_uses_the_models_tokenizer(tmp_path: Path) -> None:
    import openvino_genai

    config = tmp_path / "models.json"
    config.write_text(f'{{"models": {{"tiny": {{"path": "{LLAMA}"}}}}}}')
    settings = Settings(config=config)
    tokenizers = Tokenizers()
    expected = openvino_genai.Tokenizer(str(LLAMA)).encode("hello world").input_ids.data[0].tolist()
    assert tokenizers.encode(settings, TokenizeRequest(model="tiny", text=["hello world", ""])) == [expected, []]
    with pytest.raises(OvqError) as caught:
        tokenizers.encode(settings, TokenizeRequest(model="other", text="x"))
    assert caught.value.status == 404
