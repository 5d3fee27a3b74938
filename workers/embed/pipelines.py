"""OpenVINO GenAI's encoder pipelines for one model directory: `TextEmbeddingPipeline` for embeddings,
`TextRerankPipeline` for rerank, and the directory's tokenizer to count (and decode) tokens. Their calls release the
GIL, so they run in a thread of the worker's I/O process."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from common.modelcard import EncoderLimits
from common.models.config import ModelConfig
from common.servable import ServableType, context_length, default_pooling

# GenAI's names for OVMS's pooling modes.
_POOLING = {"CLS": "CLS", "MEAN": "MEAN", "LAST": "LAST_TOKEN"}


class TooLong(ValueError):
    """An input over the model's context while the servable does not truncate."""


def encoder_limits(model: ModelConfig, kind: ServableType, max_inputs: int) -> EncoderLimits:
    path = Path(model.path)
    max_length = model.max_position_embeddings or context_length(path, 512)
    if kind is ServableType.RERANK:
        return EncoderLimits(max_length=max_length, truncate=True, max_inputs=min(max_inputs, model.max_allowed_chunks))
    return EncoderLimits(max_length=max_length, truncate=model.truncate, allowed_dimensions=model.embedding_dimensions,
                         max_inputs=max_inputs, pooling=model.pooling or default_pooling(path),
                         normalize=model.normalize_embeddings)


class EncoderPipelines:
    """One model's pipeline and tokenizer; `load()` once, then the other calls from any one thread at a time."""

    def __init__(self, model: ModelConfig, kind: ServableType, limits: EncoderLimits, device: str) -> None:
        self.model, self.kind, self.limits, self.device = model, kind, limits, device
        self.pipe: Any = None
        self.tokenizer: Any = None
        self._lock = threading.Lock()

    def load(self) -> int:
        """Build the pipeline; returns the embedding's length (0 for rerank)."""
        import openvino_genai as g

        path, properties = str(self.model.path), dict(self.model.plugin_config)
        self.tokenizer = g.Tokenizer(path)
        if self.kind is ServableType.RERANK:
            # Every document's score, in any order: the API sorts and cuts (top_n is per request).
            config = g.TextRerankPipeline.Config(top_n=self.limits.max_inputs, max_length=self.limits.max_length)
            self.pipe = g.TextRerankPipeline(path, self.device, config, **properties)
            return 0
        pooling = getattr(g.TextEmbeddingPipeline.PoolingType, _POOLING[self.limits.pooling])
        config = g.TextEmbeddingPipeline.Config(pooling_type=pooling, normalize=self.limits.normalize,
                                                max_length=self.limits.max_length)
        self.pipe = g.TextEmbeddingPipeline(path, self.device, config, **properties)
        return len(self.pipe.embed_documents(["probe"])[0])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def lengths(self, texts: list[str]) -> list[int]:
        """Each text's tokens, special ones included (what the model sees before truncation)."""
        if not texts:
            return []
        with self._lock:
            encoded = self.tokenizer.encode(texts)
        return [int(n) for n in np.asarray(encoded.attention_mask.data).sum(axis=1)]

    def check(self, lengths: list[int]) -> list[int]:
        """The lengths the model will see: cut to max_length when truncating; else TooLong for any over it."""
        limit = self.limits.max_length
        if not self.limits.truncate:
            for index, n in enumerate(lengths):
                if n > limit:
                    raise TooLong(f"input {index} has {n} tokens, more than the model's {limit} "
                                  "(max_position_embeddings); shorten it or serve the model with truncate")
        return [min(n, limit) for n in lengths]

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dimensions]."""
        with self._lock:
            return np.asarray(self.pipe.embed_documents(texts), dtype=np.float32)

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        """Each document's relevance score, by document index."""
        with self._lock:
            ranked = self.pipe.rerank(query, documents)
        scores = [0.0] * len(documents)
        for index, score in ranked:
            scores[int(index)] = float(score)
        return scores


def cut(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first `dimensions` of each vector (Matryoshka), normalised again when the servable normalises."""
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms == 0, 1, norms)
    return np.ascontiguousarray(vectors, dtype=np.float32)
