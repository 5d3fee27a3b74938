"""An OVMS repository served unchanged: `ovq serve` with OVMS's own command line (`--config_path`, `--rest_port`),
each servable of the repository answering through the openai SDK with its graph's options in force."""
from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest
from openai import OpenAI
from PIL import Image

from tests.conftest import ROOT, _wait_ready, free_port
from tests.ovms_repository import (
    embeddings_graph,
    image_graph,
    link_model,
    llm_graph,
    rerank_graph,
    write_repository,
)

MODELS = ROOT / "tests" / "models"
LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"  # OVMS names are often Hugging Face ids, slash included
STATEFUL = "OpenVINO/tiny-llama-npu-style"
VLM = "tiny-llava"
IMAGE = "tiny-sd"
EMBED = "BAAI/tiny-embed"
RERANK = "BAAI/tiny-rerank"
PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def repository(root: Path, model_dir: Path) -> Path:
    """The seeds' graphs over the test models, with absolute and relative models_path."""
    link_model(MODELS / "tiny-llava", root / "vlm")
    link_model(MODELS / "tiny-sd", root / "sd")
    link_model(MODELS / "tiny-embed", root / "embed")
    link_model(MODELS / "tiny-rerank", root / "rerank")
    stateful_base = root / "stateful"
    stateful_base.mkdir(parents=True)
    return write_repository(root, {
        "llm": llm_graph(f'models_path: "{model_dir}"', "cache_size: 0", "max_tokens_limit: 64"),
        "stateful": llm_graph(f'models_path: "{os.path.relpath(MODELS / "tiny-llama", stateful_base)}"',
                              "pipeline_type: LM", """plugin_config: '{"MAX_PROMPT_LEN": 1024}'"""),
        "vlm": llm_graph('models_path: "./"', "cache_size: 0", "max_num_seqs: 4"),
        "sd": image_graph('models_path: "./"', 'device: "CPU"', 'max_resolution: "128x128"',
                          "default_num_inference_steps: 2", "max_num_inference_steps: 8"),
        "embed": embeddings_graph('models_path: "./"', "normalize_embeddings: false", "pooling: MEAN",
                                  "truncate: true", 'target_device: "CPU"'),
        "rerank": rerank_graph('models_path: "./"', "max_allowed_chunks: 3", 'target_device: "CPU"'),
    }, [{"name": LLM, "base_path": "llm"}, {"name": STATEFUL, "base_path": "stateful"},
        {"name": VLM, "base_path": "vlm"}, {"name": IMAGE, "base_path": "sd"},
        {"name": EMBED, "base_path": "embed"}, {"name": RERANK, "base_path": "rerank"}])


@pytest.fixture(scope="module")
def client(model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    """`ovq serve` on the session's Redis under its own key prefix: four workers and the API, started together."""
    work = tmp_path_factory.mktemp("ovms")
    config = repository(work / "repo", model_dir)
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("OVQ_CONFIG", "OVQ_OVMS_CONFIG")}
    env.update(REDIS_URL=redis_url, OVQ_KEY_PREFIX="ovqovms", OVQ_SHUTDOWN_GRACE_S="5", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "cli.main", "serve", "--config_path", str(config), "--rest_port", str(port),
               "--rest_bind_address", "127.0.0.1", "--log_level", "WARNING"]
    serve = subprocess.Popen(command, env=env, cwd=ROOT, stdout=(work / "serve.log").open("wb"),
                             stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/health", [serve], work, {LLM, STATEFUL, VLM, IMAGE, EMBED, RERANK})
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v3", api_key="unused", max_retries=0, timeout=120)
    finally:
        children = psutil.Process(serve.pid).children(recursive=True)
        serve.send_signal(signal.SIGTERM)  # stops the API, then the workers, in order
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        for child in children:  # each tier runs in its own session: none may outlive a failed stop
            if child.is_running():
                child.kill()


def test_every_servable_is_listed_under_its_ovms_name(client: OpenAI) -> None:
    assert {m.id for m in client.models.list()} >= {LLM, STATEFUL, VLM, IMAGE, EMBED, RERANK}


def test_continuous_batching_llm_with_its_graph_limits(client: OpenAI) -> None:
    answer = client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": "What is the "
                                                                  "capital of France?"}], temperature=0, max_tokens=20)
    assert answer.model == LLM
    assert "Paris" in answer.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # max_tokens_limit: 64 in graph.pbtxt
        client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": "Hi"}], max_tokens=65)


def test_an_llm_graph_serves_the_responses_api_with_its_graph_limits(client: OpenAI) -> None:
    question = "What is the capital of France?"
    response = client.responses.create(model=LLM, input=question, temperature=0, max_output_tokens=20)
    chat = client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": question}],
                                          temperature=0, max_tokens=20)
    assert (response.model, response.output_text) == (LLM, chat.choices[0].message.content)
    assert client.responses.retrieve(response.id).output_text == response.output_text
    with pytest.raises(openai.BadRequestError) as caught:  # max_tokens_limit: 64 in graph.pbtxt
        client.responses.create(model=LLM, input="Hi", max_output_tokens=65)
    assert caught.value.body["param"] == "max_output_tokens"


def test_stateful_servable_from_pipeline_type_lm(client: OpenAI) -> None:
    answer = client.completions.create(model=STATEFUL, prompt=PROMPT.format("Hello"), max_tokens=5,
                                       extra_body={"ignore_eos": True})
    assert answer.choices[0].text and answer.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError):  # a stateful pipeline makes one sequence
        client.completions.create(model=STATEFUL, prompt="Hello", max_tokens=5, n=2)


def test_vision_language_servable_reads_an_image(client: OpenAI) -> None:
    def describe(colour: tuple[int, int, int]) -> str:
        buffer = io.BytesIO()
        Image.new("RGB", (30, 30), colour).save(buffer, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe this image."}]
        answer = client.chat.completions.create(model=VLM, messages=[{"role": "user", "content": content}],
                                                max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        assert answer.usage.completion_tokens == 8
        return answer.choices[0].message.content

    assert describe((255, 0, 0)) != describe((0, 0, 255))  # the image reached the model


def test_image_generation_servable_with_its_graph_limits(client: OpenAI) -> None:
    result = client.images.generate(model=IMAGE, prompt="a red square", size="64x64", response_format="b64_json")
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert (image.format, image.size) == ("PNG", (64, 64))
    with pytest.raises(openai.BadRequestError, match="max_resolution 128x128"):
        client.images.generate(model=IMAGE, prompt="a red square", size="256x256")
    with pytest.raises(openai.BadRequestError, match=r"max_num_inference_steps \(8\)"):
        client.images.generate(model=IMAGE, prompt="a red square", size="64x64", extra_body={"num_inference_steps": 9})


def test_embeddings_graph_with_its_pooling_and_normalization(client: OpenAI) -> None:
    import numpy as np
    import openvino_genai as g

    texts = ["the cat", "the quick brown fox jumps over the lazy dog " * 30]  # the second is truncated
    got = client.embeddings.create(model=EMBED, input=texts, encoding_format="float")
    config = g.TextEmbeddingPipeline.Config(pooling_type=g.TextEmbeddingPipeline.PoolingType.MEAN, normalize=False,
                                            max_length=128)
    own = g.TextEmbeddingPipeline(str(MODELS / "tiny-embed"), "CPU", config).embed_documents(texts)
    np.testing.assert_allclose([d.embedding for d in got.data], own, atol=1e-6)
    assert abs(np.linalg.norm(got.data[0].embedding) - 1.0) > 1e-3  # not normalised, as the graph says


def test_rerank_graph_with_its_document_limit(client: OpenAI) -> None:
    import httpx

    url = f"{client.base_url}rerank"
    ranked = httpx.post(url, json={"model": RERANK, "query": "cat", "documents": ["a cat", "a dog"]}, timeout=60)
    assert ranked.status_code == 200 and sorted(r["index"] for r in ranked.json()["results"]) == [0, 1]
    too_many = httpx.post(url, json={"model": RERANK, "query": "cat", "documents": ["a"] * 4}, timeout=60)
    assert too_many.status_code == 400 and "max_allowed_chunks" in too_many.json()["error"]["message"]
