"""The encoder pipelines on the tiny random-weight models: limits, token counts, refusals, cut vectors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.models.config import ModelConfig
from common.servable import ServableType
from workers.embed.pipelines import EncoderPipelines, TooLong, cut, encoder_limits

MODELS = Path(__file__).resolve().parents[3] / "models"


def pipes(name: str, kind: ServableType, **options: object) -> EncoderPipelines:
    model = ModelConfig(name=name, path=MODELS / name, **options)
    pipelines = EncoderPipelines(model, kind, encoder_limits(model, kind, 100), "CPU")
    pipelines.limits.dimensions = pipelines.load()
    return pipelines


def test_limits_from_the_models_file_and_the_directory() -> None:
    model = ModelConfig(name="e", path=MODELS / "tiny-embed", truncate=True, embedding_dimensions=[8])
    limits = encoder_limits(model, ServableType.EMBEDDINGS, 2048)
    assert (limits.max_length, limits.truncate, limits.allowed_dimensions, limits.pooling) == (128, True, [8], "CLS")
    rerank = ModelConfig(name="r", path=MODELS / "tiny-rerank", max_allowed_chunks=5, max_position_embeddings=64)
    limits = encoder_limits(rerank, ServableType.RERANK, 2048)
    assert (limits.max_length, limits.max_inputs, limits.truncate) == (64, 5, True)


def test_embeddings_lengths_and_refusal() -> None:
    embed = pipes("tiny-embed", ServableType.EMBEDDINGS, max_position_embeddings=8)
    assert embed.limits.dimensions == 32
    lengths = embed.lengths(["the cat", "the quick brown fox jumps over the lazy dog"])
    assert lengths[0] < 8 < lengths[1]
    with pytest.raises(TooLong, match="input 1 has .* tokens, more than the model's 8"):
        embed.check(lengths)
    embed.limits.truncate = True
    assert embed.check(lengths) == [lengths[0], 8]
    vectors = embed.embed(["hello world", "a cat"])
    assert vectors.shape == (2, 32) and vectors.dtype == np.float32
    assert embed.decode(embed.tokenizer.encode("hello world").input_ids.data[0].tolist()) == "hello world"


def test_rerank_scores_by_document_index() -> None:
    import openvino_genai as g

    rerank = pipes("tiny-rerank", ServableType.RERANK)
    documents = ["Paris is the capital", "a cat", "dog"]
    scores = rerank.rerank("capital of France", documents)
    own = g.TextRerankPipeline(str(MODELS / "tiny-rerank"), "CPU", g.TextRerankPipeline.Config(top_n=10))
    assert scores == [dict(own.rerank("capital of France", documents))[i] for i in range(3)]


def test_cut_keeps_the_first_dimensions_and_renormalises() -> None:
    vectors = np.asarray([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(cut(vectors, 2, normalize=True), [[0.6, 0.8], [1.0, 0.0]])
    np.testing.assert_allclose(cut(vectors, 2, normalize=False), [[3.0, 4.0], [1.0, 0.0]])
    assert cut(vectors, None, normalize=True) is vectors
    assert cut(np.zeros((1, 3), dtype=np.float32), 2, normalize=True).tolist() == [[0.0, 0.0]]
