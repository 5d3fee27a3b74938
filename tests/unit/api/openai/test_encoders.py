"""/embeddings and /rerank requests: their forms, the checks against the model's card, the ranking."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from pydantic import ValidationError

from api.openai.encoder_protocol import EmbeddingRequest, EmbeddingResponse, RerankRequest
from api.openai.encoders import check_embedding, decode_vector, embedding_body, ranked
from common.errors import OvqError
from common.modelcard import EncoderLimits

LIMITS = EncoderLimits(max_length=16, dimensions=32, allowed_dimensions=[8], max_inputs=3)


@pytest.mark.parametrize(("given", "inputs"), [
    ("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]]),
])
def test_openai_input_forms(given: object, inputs: list) -> None:
    assert EmbeddingRequest(model="m", input=given).inputs() == inputs


@pytest.mark.parametrize("given", ["", [], ["a", ""], [[]], ["a", 1]])
def test_empty_or_mixed_input_is_refused(given: object) -> None:
    with pytest.raises(ValidationError):
        EmbeddingRequest(model="m", input=given)


@pytest.mark.parametrize(("body", "param", "text"), [
    ({"input": ["a"] * 4}, "input", "at most 3"),
    ({"input": "a", "dimensions": 16}, "dimensions", "gives 8, 32"),
    ({"input": [list(range(17))]}, "input", "more than the model's 16"),
    ({"input": [[5, 100]]}, "input", "outside the model's vocabulary (0 to 99)"),
    ({"input": [[-1]]}, "input", "outside the model's vocabulary"),
])
def test_requests_the_model_cannot_take(body: dict, param: str, text: str) -> None:
    with pytest.raises(OvqError) as caught:
        check_embedding(EmbeddingRequest(model="m", **body), LIMITS, 100)
    assert caught.value.status == 400 and caught.value.body.param == param and text in caught.value.body.message


def test_allowed_dimensions_and_long_ids_when_truncating() -> None:
    assert check_embedding(EmbeddingRequest(model="m", input="a", dimensions=8), LIMITS, 100) == ["a"]
    assert check_embedding(EmbeddingRequest(model="m", input="a", dimensions=32), LIMITS, 100) == ["a"]
    truncating = LIMITS.model_copy(update={"truncate": True})
    assert check_embedding(EmbeddingRequest(model="m", input=list(range(20))), truncating, 100) == [list(range(20))]


def test_vector_decoding() -> None:
    values = np.asarray([0.5, -1.25], dtype="<f4")
    assert decode_vector(base64.b64encode(values.tobytes()).decode()).tolist() == [0.5, -1.25]


def test_embedding_body_is_openais_response_in_either_format() -> None:
    values = np.asarray([0.1, -2.5, 3e-8], dtype="<f4")
    encoded = base64.b64encode(values.tobytes()).decode()
    floats = EmbeddingResponse.model_validate_json(embedding_body([encoded, encoded], "m", 7, floats=True))
    assert [d.index for d in floats.data] == [0, 1] and floats.usage.total_tokens == 7 and floats.model == "m"
    assert np.asarray(floats.data[1].embedding, dtype="<f4").tobytes() == values.tobytes()  # float32 round trip
    assert EmbeddingResponse.model_validate_json(embedding_body([encoded], "m", 7, floats=False)).data[0].embedding \
        == encoded


def test_ranking_top_n_ties_and_documents() -> None:
    body = RerankRequest(model="m", query="q", documents=["a", {"text": "b", "id": 7}, "c"], top_n=2,
                         return_documents=True)
    results = ranked(body, [0.1, 0.9, 0.9])
    assert [(r.index, r.relevance_score) for r in results] == [(1, 0.9), (2, 0.9)]
    assert [r.document for r in results] == [{"text": "b", "id": 7}, {"text": "c"}]
    plain = RerankRequest(model="m", query="q", documents=["a", "b"])
    assert [(r.index, r.document) for r in ranked(plain, [0.2, 0.3])] == [(1, None), (0, None)]


@pytest.mark.parametrize("body", [{"query": "q", "documents": []}, {"query": "", "documents": ["a"]},
                                  {"query": "q", "documents": ["a"], "top_n": 0},
                                  {"query": "q", "documents": [{"title": "no text"}]},
                                  {"query": "q", "documents": ["a"], "max_chunks_per_doc": 2}])
def test_rerank_requests_refused(body: dict) -> None:
    with pytest.raises(ValidationError):
        RerankRequest(model="m", **body)
