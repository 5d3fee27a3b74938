"""A model's footprint before it loads: its IR files (not the GGUF they came from), a margin, and its KV cache."""
from __future__ import annotations

from pathlib import Path

from common.models.config import ModelConfig
from workers.pool.footprint import GIB, GROWING_KV, MARGIN, footprint, ir_bytes


def test_the_ir_files_count_and_a_converted_gguf_does_not(tmp_path: Path) -> None:
    (tmp_path / "openvino_model.bin").write_bytes(b"x" * 1000)
    (tmp_path / "openvino_model.xml").write_bytes(b"x" * 100)
    (tmp_path / "tokenizer.json").write_bytes(b"x" * 5000)  # not weights
    assert ir_bytes(tmp_path) == 1100
    (tmp_path / "model.gguf").write_bytes(b"x" * 900)
    assert ir_bytes(tmp_path) == 1100


def test_a_gguf_alone_counts(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"x" * 900)
    assert ir_bytes(tmp_path) == 900


def test_the_kv_cache_reserved_adds_to_the_weights(tmp_path: Path) -> None:
    (tmp_path / "openvino_model.bin").write_bytes(b"x" * 1000)
    assert footprint(ModelConfig(name="m", path=tmp_path, cache_size=2)) == int(1000 * MARGIN) + 2 * GIB
    assert footprint(ModelConfig(name="m", path=tmp_path, cache_size=0)) == int(1000 * MARGIN) + GROWING_KV
