"""Benchmark clients pointed at the README's base URL work: the requests guidellm 0.8 makes (its health check,
its model list, a streamed chat completion with its vLLM-style fields), sent with a plain HTTP client (guidellm
itself pulls in torch, transformers and datasets), against `/v3` and `/v1` and against the bare host, which is
what guidellm asks for once it has cut `/v1` off its target."""
from __future__ import annotations

import httpx
import orjson
import pytest

from tests.conftest import MODEL, Stack
from tests.integration import sse

TOKENS = 6


def guidellm_chat(max_tokens: int) -> dict:
    """The body guidellm's chat handler sends for a text prompt with a fixed output length."""
    return {"model": MODEL, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_completion_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Count to ten."}]}]}


def streamed_tokens(client: httpx.Client, url: str) -> tuple[str, int]:
    """(the text, the completion tokens of the usage chunk) of one streamed chat completion."""
    text, usage = "", None
    with client.stream("POST", url, json=guidellm_chat(TOKENS)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in sse.lines(response):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[len("data: "):])
            for choice in chunk.get("choices") or []:
                text += choice["delta"].get("content") or ""
            usage = chunk.get("usage") or usage
    assert usage is not None, "no usage chunk"
    return text, usage["completion_tokens"]


@pytest.mark.parametrize("base", ["/v3", "/v1"])
def test_health_models_and_a_streamed_chat_answer_under_the_base_url(stack: Stack, base: str) -> None:
    with httpx.Client(base_url=stack.url(base), timeout=60) as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["ready"] is True, health.text
        assert health.json()["models"][MODEL] is True
        models = client.get("/models")
        assert models.status_code == 200 and MODEL in {m["id"] for m in models.json()["data"]}
        text, tokens = streamed_tokens(client, "/chat/completions")
    assert text and tokens == TOKENS


def test_guidellm_target_without_a_version_finds_health_models_and_chat(stack: Stack) -> None:
    """guidellm strips a trailing `/v1` from its target, then asks `{target}/health`, `{target}/v1/models` and
    `{target}/v1/chat/completions`: `http://HOST:PORT` and `http://HOST:PORT/v1` both land on these."""
    with httpx.Client(base_url=stack.url(""), timeout=60) as client:
        assert client.get("/health").status_code == 200
        assert MODEL in {m["id"] for m in client.get("/v1/models").json()["data"]}
        assert streamed_tokens(client, "/v1/chat/completions")[1] == TOKENS


def test_the_base_url_health_is_readiness_and_unknown_paths_stay_404(stack: Stack) -> None:
    """`{base}/health` is the same answer as `/v2/health/ready`; it opens no other path under the prefix."""
    ready = httpx.get(stack.url("/v2/health/ready"), timeout=30).json()
    assert httpx.get(stack.url("/v3/health"), timeout=30).json().keys() == ready.keys()
    missing = httpx.get(stack.url("/v3/healthz"), timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
