"""LoRA adapters made alike: one rank and one set of layers for every adapter a text engine serves.

GenAI 2026.4's dynamic LoRA mode keeps each adapted layer's A, B and alpha as variable states whose shapes follow
the active adapter: rank 4 for one, 8 for another, 0 with no adapter (an empty `AdapterConfig`). Switching between
adapters of different ranks or layers while the continuous-batching pipeline runs crashes the CPU plugin in
`InferRequest::infer` from `step()` (a segfault or `malloc(): ... corrupted`; reproduced in
`benchmarks/lora_crash.py`, about one run in two of 3,000 mixed jobs). With every adapter padded to the largest rank
and to every layer any of them adapts (zero rows of A, zero columns of B: B·A is unchanged), and the base model run
as the first adapter at alpha 0, the states keep one shape for the engine's life and the crash is gone.

Only the safetensors container is read here (an 8-byte header length, a JSON header, raw row-major data), so any
element type pads by its width.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass
class Matrix:
    """One LoRA matrix of a safetensors file: its element type, shape and raw bytes."""

    dtype: str
    shape: list[int]
    data: bytes


def read(path: str | Path) -> dict[str, Matrix]:
    return read_bytes(Path(path).read_bytes())


def read_bytes(raw: bytes) -> dict[str, Matrix]:
    """A safetensors file's 2-D tensors by name (metadata and other entries, such as kohya's alphas, are left out:
    GenAI takes alpha from the config only)."""
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    start = 8 + size
    out: dict[str, Matrix] = {}
    for name, entry in header.items():
        if name == "__metadata__" or len(entry.get("shape", [])) != 2 or entry["dtype"] not in _WIDTH:
            continue
        begin, end = entry["data_offsets"]
        out[name] = Matrix(entry["dtype"], list(entry["shape"]), raw[start + begin:start + end])
    return out


def _is_a(name: str) -> bool:
    """peft's `lora_A` and kohya's `lora_down` are the [rank, in] matrix; the other is [out, rank]."""
    return "lora_A" in name or "lora_down" in name


def rank(name: str, matrix: Matrix) -> int:
    return matrix.shape[0] if _is_a(name) else matrix.shape[1]


def _pad(name: str, matrix: Matrix, to: int) -> Matrix:
    width = _WIDTH[matrix.dtype]
    rows, cols = matrix.shape
    if _is_a(name):  # [rank, in]: zero rows after the data
        return Matrix(matrix.dtype, [to, cols], matrix.data + bytes((to - rows) * cols * width))
    row, pad = cols * width, bytes((to - cols) * width)  # [out, rank]: zero columns at the end of each row
    data = b"".join(matrix.data[i * row:(i + 1) * row] + pad for i in range(rows))
    return Matrix(matrix.dtype, [rows, to], data)


def _zero(name: str, like: Matrix, to: int) -> Matrix:
    shape = [to, like.shape[1]] if _is_a(name) else [like.shape[0], to]
    return Matrix(like.dtype, shape, bytes(shape[0] * shape[1] * _WIDTH[like.dtype]))


def write(matrices: dict[str, Matrix]) -> bytes:
    header, chunks, offset = {}, [], 0
    for name in sorted(matrices):
        matrix = matrices[name]
        end = offset + len(matrix.data)
        header[name] = {"dtype": matrix.dtype, "shape": matrix.shape, "data_offsets": [offset, end]}
        chunks.append(matrix.data)
        offset = end
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def alike(paths: dict[str, str | Path]) -> dict[str, bytes]:
    """Each adapter's safetensors bytes, padded to the adapters' largest rank and to the union of their layers."""
    adapters = {name: read(path) for name, path in paths.items()}
    every: dict[str, Matrix] = {}
    for matrices in adapters.values():
        for layer, matrix in matrices.items():
            every.setdefault(layer, matrix)
    top = max((rank(layer, m) for matrices in adapters.values() for layer, m in matrices.items()), default=0)
    out = {}
    for name, matrices in adapters.items():
        padded = {layer: _pad(layer, m, top) for layer, m in matrices.items()}
        padded.update({layer: _zero(layer, m, top) for layer, m in every.items() if layer not in padded})
        out[name] = write(padded)
    return out
