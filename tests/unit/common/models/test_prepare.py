"""`ovq models prepare`: what a prepared directory holds besides the IR, also when an older ovq prepared it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.models import prepare as preparing
from common.models.config import ModelConfig
from common.models.prepare import FORMAT, STAMP, is_current, prepare
from common.models.sources import DEFAULT_SOURCE
from tests.unit.common.models.test_hf_tokenizer import tiny_gguf


def test_a_directory_an_older_ovq_prepared_gets_the_files_it_lacks_without_a_second_conversion(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "openvino_model.xml").write_text("")  # converted already
    (model_dir / "config.json").write_text('{"max_position_embeddings": 4096}')
    (model_dir / "generation_config.json").write_text('{"max_new_tokens": 7}')
    monkeypatch.setattr(preparing, "_convert", lambda gguf_path: pytest.fail("converted again"))
    model = ModelConfig(name="m", path=model_dir, source=str(tiny_gguf(tmp_path / "t.gguf")))
    assert not is_current(model_dir)
    assert prepare(model) == model_dir and is_current(model_dir)
    assert json.loads((model_dir / "config.json").read_text()) == {"max_position_embeddings": 4096,
                                                                   "vocab_size": 264}  # what it said is kept
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "max_new_tokens": 7}
    assert (model_dir / "tokenizer.json").exists() and (model_dir / "tokenizer_config.json").exists()
    assert json.loads((model_dir / STAMP).read_text())["format"] == FORMAT
    (tmp_path / "t.gguf").unlink()
    assert prepare(model) == model_dir  # current: the source is not read again


def test_a_directory_whose_source_is_gone_is_served_as_it_is(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "openvino_model.xml").write_text("")
    model = ModelConfig(name="m", path=tmp_path, source=str(tmp_path / "deleted.gguf"))
    assert prepare(model) == tmp_path and not is_current(tmp_path)
    assert "serving it as it is" in capsys.readouterr().err


def test_a_directory_without_a_source_is_the_users_and_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "openvino_model.xml").write_text("")
    assert prepare(ModelConfig(name="m", path=tmp_path)) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["openvino_model.xml"]


def test_the_default_model_gets_its_published_sampling_and_a_bounded_answer_length(tmp_path: Path) -> None:
    preparing._write_metadata(tiny_gguf(tmp_path / "t.gguf"), tmp_path, DEFAULT_SOURCE)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": True,
                          "temperature": 0.2, "top_p": 0.9, "max_new_tokens": 512}


def test_the_prepared_default_model_says_how_long_an_answer_may_be(model_dir: Path) -> None:
    from common.servable import generation_defaults

    assert is_current(model_dir)
    assert generation_defaults(model_dir) == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 512}
