"""Embeddings (official openai SDK) and rerank (plain HTTP) through the queue, on tiny random-weight BERT models:
the vectors are TextEmbeddingPipeline's own, the scores TextRerankPipeline's own."""
from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import orjson
import pytest
from openai import OpenAI

from tests.conftest import MODELS, Tiers
from tests.precision import run_precision

EMBED, RERANK, SMALL = "tiny-embed", "tiny-rerank", "tiny-embed-short"
TEXTS = ["The capital of France is Paris.", "hello world", "a cat, a dog and a little red bird"]


@pytest.fixture(scope="module")
def tiers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    models = {EMBED: {"path": str(MODELS / "tiny-embed"), "pooling": "MEAN", "embedding_dimensions": [8]},
              SMALL: {"path": str(MODELS / "tiny-embed"), "max_position_embeddings": 8},
              RERANK: {"path": str(MODELS / "tiny-rerank"), "max_allowed_chunks": 4}}
    t = Tiers(redis_url, tmp_path_factory.mktemp("embeddings"), models, OVQ_API_KEYS="sk-embed",
              OVQ_BATCH_API_KEY="sk-embed", OVQ_BATCH_SWEEP_S="0.5")
    for name in models:
        t.worker(name, name=name)
    t.api()
    try:
        t.wait_served(*models)
        t.start("batch-worker", "--api-url", f"http://127.0.0.1:{t.port}", "--name", "bw", name="bw")
        yield t
    finally:
        t.stop()


@pytest.fixture(scope="module")
def client(tiers: Tiers) -> OpenAI:
    return OpenAI(base_url=tiers.base_url, api_key="sk-embed", max_retries=0, timeout=60)


def genai_embeddings(texts: list[str], **config: object) -> np.ndarray:
    import openvino_genai as g

    pooling = g.TextEmbeddingPipeline.PoolingType.MEAN
    pipe = g.TextEmbeddingPipeline(str(MODELS / "tiny-embed"), "CPU",
                                   g.TextEmbeddingPipeline.Config(pooling_type=pooling, normalize=True, **config),
                                   **run_precision())
    return np.asarray(pipe.embed_documents(texts), dtype=np.float32)


def post(tiers: Tiers, path: str, body: dict, key: str = "sk-embed") -> httpx.Response:
    return httpx.post(tiers.base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


@pytest.mark.numerics
def test_vectors_are_the_pipelines_own(client: OpenAI) -> None:
    result = client.embeddings.create(model=EMBED, input=TEXTS, encoding_format="float")
    vectors = np.asarray([d.embedding for d in result.data], dtype=np.float32)
    assert [d.index for d in result.data] == [0, 1, 2]
    np.testing.assert_allclose(vectors, genai_embeddings(TEXTS), atol=1e-6)
    assert result.model == EMBED and result.usage.prompt_tokens == result.usage.total_tokens > len(TEXTS)
    single = client.embeddings.create(model=EMBED, input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, vectors[1], atol=1e-6)


def test_base64_is_little_endian_float32(client: OpenAI) -> None:
    as_floats = client.embeddings.create(model=EMBED, input=TEXTS[0], encoding_format="float").data[0].embedding
    raw = client.embeddings.with_raw_response.create(model=EMBED, input=TEXTS[0], encoding_format="base64")
    encoded = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(encoded), dtype="<f4"),
                                  np.asarray(as_floats, dtype=np.float32))
    # The SDK asks for base64 by default and decodes it itself.
    decoded = client.embeddings.create(model=EMBED, input=TEXTS[0]).data[0].embedding
    np.testing.assert_array_equal(np.asarray(decoded, dtype=np.float32), np.asarray(as_floats, dtype=np.float32))


def test_token_ids_are_embedded_as_their_text(client: OpenAI) -> None:
    import openvino_genai as g

    ids = g.Tokenizer(str(MODELS / "tiny-embed")).encode("hello world", add_special_tokens=False)
    tokens = ids.input_ids.data[0].tolist()
    from_ids = client.embeddings.create(model=EMBED, input=[tokens, tokens], encoding_format="float")
    from_text = client.embeddings.create(model=EMBED, input="hello world", encoding_format="float")
    assert len(from_ids.data) == 2
    np.testing.assert_allclose(from_ids.data[1].embedding, from_text.data[0].embedding, atol=1e-6)


def test_dimensions_cut_and_renormalise(client: OpenAI) -> None:
    full = np.asarray(client.embeddings.create(model=EMBED, input=TEXTS[0], encoding_format="float")
                      .data[0].embedding)
    cut = np.asarray(client.embeddings.create(model=EMBED, input=TEXTS[0], dimensions=8, encoding_format="float")
                     .data[0].embedding)
    assert cut.shape == (8,)
    np.testing.assert_allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    same = client.embeddings.create(model=EMBED, input=TEXTS[0], dimensions=len(full), encoding_format="float")
    assert len(same.data[0].embedding) == len(full)


@pytest.mark.parametrize(("kwargs", "param", "text"), [
    ({"input": ""}, "input", "must not be empty"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": ["a", ""]}, "input", "must not be empty"),
    ({"input": "x", "dimensions": 5}, "dimensions", "dimensions 5 is not available"),
    ({"input": "x", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": [[1, 10**6]]}, "input", "outside the model's vocabulary"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", ""),
])
def test_bad_requests_are_400(client: OpenAI, kwargs: dict, param: str, text: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=EMBED, **kwargs)
    error = caught.value.body
    assert param in str(error["param"]) and text in error["message"]


def test_too_long_input_is_400_unless_truncating(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="more than the model's 8"):
        client.embeddings.create(model=SMALL, input="the quick brown fox jumps over the lazy dog")
    with pytest.raises(openai.BadRequestError, match="more than the model's 8"):
        client.embeddings.create(model=SMALL, input=[list(range(5, 20))])


def test_wrong_model_kind_and_key(tiers: Tiers, client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="does not compute embeddings"):
        client.embeddings.create(model=RERANK, input="x")
    assert post(tiers, "/embeddings", {"model": EMBED, "input": "x"}, key="wrong").status_code == 401
    listed = {m.id for m in client.models.list().data}
    assert {EMBED, RERANK, SMALL} <= listed


@pytest.mark.numerics
def test_many_concurrent_requests_each_get_their_own_vector(tiers: Tiers) -> None:
    """Requests batched into shared pipeline calls still get their own input's vector."""
    import asyncio

    texts = [f"number {i} is a small dog" for i in range(24)]
    expected = genai_embeddings(texts)

    async def one(http: httpx.AsyncClient, text: str) -> list[float]:
        reply = await http.post(tiers.base_url + "/embeddings", json={"model": EMBED, "input": text},
                                headers={"Authorization": "Bearer sk-embed"})
        return reply.json()["data"][0]["embedding"]

    async def all_of_them() -> list[list[float]]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*(one(http, t) for t in texts))

    np.testing.assert_allclose(np.asarray(asyncio.run(all_of_them())), expected, atol=1e-6)


@pytest.mark.numerics
def test_batch_api_takes_embeddings_lines(client: OpenAI) -> None:
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBED, "input": text, "encoding_format": "float"}} for i, text in enumerate(TEXTS)]
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    uploaded = client.files.create(file=("embed.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.output_file_id is not None
    outputs = [orjson.loads(x) for x in client.files.content(batch.output_file_id).content.split(b"\n") if x]
    vectors = {o["custom_id"]: o["response"]["body"]["data"][0]["embedding"] for o in outputs}
    expected = genai_embeddings(TEXTS)
    np.testing.assert_allclose([vectors[f"e{i}"] for i in range(len(TEXTS))], expected, atol=1e-6)


def genai_scores(query: str, documents: list[str]) -> list[float]:
    import openvino_genai as g

    pipe = g.TextRerankPipeline(str(MODELS / "tiny-rerank"), "CPU", g.TextRerankPipeline.Config(top_n=100),
                                **run_precision())
    scores = [0.0] * len(documents)
    for index, score in pipe.rerank(query, documents):
        scores[index] = score
    return scores


@pytest.mark.numerics
def test_rerank_orders_by_the_pipelines_scores(tiers: Tiers) -> None:
    documents = ["Paris is the capital of France", "a cat", "the sky is blue", "dog"]
    reply = post(tiers, "/rerank", {"model": RERANK, "query": "capital of France", "documents": documents,
                                    "top_n": 3})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    expected = genai_scores("capital of France", documents)
    order = sorted(range(4), key=lambda i: -expected[i])[:3]
    assert [r["index"] for r in results] == order
    assert [r["relevance_score"] for r in results] == pytest.approx([expected[i] for i in order], abs=1e-6)
    assert all("document" not in r for r in results)
    assert reply.json()["usage"]["total_tokens"] > 0


def test_rerank_returns_documents_as_given(tiers: Tiers) -> None:
    documents = [{"text": "a red bird", "id": "b"}, "a green field"]
    v1 = tiers.base_url.replace("/v3", "/v1")
    reply = httpx.post(f"{v1}/rerank", json={"model": RERANK, "query": "bird", "documents": documents,
                                             "return_documents": True},
                       headers={"Authorization": "Bearer sk-embed"}, timeout=60)
    results = reply.json()["results"]
    assert len(results) == 2
    by_index = {r["index"]: r["document"] for r in results}
    assert by_index == {0: {"text": "a red bird", "id": "b"}, 1: {"text": "a green field"}}


@pytest.mark.parametrize(("body", "status", "text"), [
    ({"query": "q", "documents": []}, 400, "documents"),
    ({"query": "", "documents": ["a"]}, 400, "query"),
    ({"query": "q", "documents": ["a"] * 5}, 400, "at most 4"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["x"]}, 400, "unsupported field"),
])
def test_rerank_errors(tiers: Tiers, body: dict, status: int, text: str) -> None:
    reply = post(tiers, "/rerank", {"model": RERANK, **body})
    assert reply.status_code == status, reply.text
    assert text in reply.json()["error"]["message"]

