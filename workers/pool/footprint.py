"""A model's memory footprint, estimated before it is loaded: what a pool worker budgets with.

The weights dominate, and on CPU OpenVINO keeps them at about their size on disk (the IR's `.bin` files; a GGUF
converts to IR first): so the IR files' sizes, the draft model's too, times a margin for compiled kernels and
buffers, plus the KV cache the models file reserves (`cache_size`, GB; 0 lets it grow: a fixed headroom then).
"""
from __future__ import annotations

from pathlib import Path

from common.models.config import ModelConfig

GIB = 1 << 30
MARGIN = 1.25  # compiled model and runtime buffers over the weights' bytes
GROWING_KV = 256 << 20  # cache_size 0: the KV cache grows with the running sequences; what a few small ones take
IR_SUFFIXES = (".bin", ".xml", ".gguf", ".onnx", ".safetensors")


def ir_bytes(directory: Path) -> int:
    """The model files under a model directory (weights and graphs, of every sub-model such as a VLM's)."""
    if not directory.exists():
        return 0
    files = [p for p in directory.rglob("*") if p.is_file() and p.suffix in IR_SUFFIXES]
    if any(p.suffix == ".xml" for p in files):  # converted: the GGUF it came from is not what loads
        files = [p for p in files if p.suffix != ".gguf"]
    return sum(p.stat().st_size for p in files)


def footprint(model: ModelConfig) -> int:
    """Bytes `model` is expected to take once loaded."""
    weights = ir_bytes(Path(model.path))
    if model.draft_models_path is not None:
        weights += ir_bytes(Path(model.draft_models_path))
    kv = int(model.cache_size * GIB) if model.cache_size else GROWING_KV
    return int(weights * MARGIN) + kv
