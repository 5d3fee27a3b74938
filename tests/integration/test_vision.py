"""Vision-language chat: image_url parts through the queue to a continuous-batching VLM worker."""
from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from openai import OpenAI
from PIL import Image

from tests.conftest import MODEL, STATEFUL_VLM, VLM, Stack


def data_url(colour: tuple[int, int, int], size: tuple[int, int] = (40, 40)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def ask(client: OpenAI, url: str, model: str = VLM, **extra: object):
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe this image."}]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=8, temperature=0, extra_body={"ignore_eos": True}, **extra)


def test_chat_with_a_base64_image(client: OpenAI) -> None:
    red = ask(client, data_url((255, 0, 0)))
    blue = ask(client, data_url((0, 0, 255)))
    assert red.usage.completion_tokens == 8 and red.choices[0].finish_reason == "length"
    assert red.choices[0].message.content != blue.choices[0].message.content  # the image reached the model
    assert ask(client, data_url((255, 0, 0))).choices[0].message.content == red.choices[0].message.content


def test_chat_with_a_base64_image_on_a_stateful_vlm(client: OpenAI) -> None:
    url = data_url((120, 40, 200))
    stateful = ask(client, url, model=STATEFUL_VLM)
    assert stateful.usage.completion_tokens == 8 and stateful.choices[0].finish_reason == "length"
    # Random weights: SDPA (stateful) and paged attention (batching) drift apart, so compare the servable
    # with itself: the same image gives the same text, another image another text.
    assert ask(client, url, model=STATEFUL_VLM).choices[0].message.content == stateful.choices[0].message.content
    other = ask(client, data_url((0, 255, 0)), model=STATEFUL_VLM).choices[0].message.content
    assert other != stateful.choices[0].message.content
    stream = ask(client, url, model=STATEFUL_VLM, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == stateful.choices[0].message.content


def test_streamed_vision_chat_equals_unary(client: OpenAI) -> None:
    url = data_url((0, 200, 0))
    unary = ask(client, url).choices[0].message.content
    stream = ask(client, url, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == unary


def test_local_file_inside_the_allowed_path(stack: Stack, client: OpenAI) -> None:
    media = stack.logs / "media"
    Image.new("RGB", (30, 30), (9, 9, 9)).save(media / "dark.png")
    assert ask(client, str(media / "dark.png")).usage.completion_tokens == 8
    assert ask(client, f"file://{media / 'dark.png'}").usage.completion_tokens == 8


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("http://example.com/cat.png", "not in allowed_media_domains"),
        ("ftp://x/cat.png", "scheme"),
        ("data:image/png;base64,!!!", "base64"),
        ("data:text/plain;base64,aGk=", "data:image"),
        ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "could not be read"),
        ("../../etc/passwd", "outside allowed_local_media_path"),
        ("/etc/passwd", "outside allowed_local_media_path"),
    ],
)
def test_rejected_images_are_400s(client: OpenAI, url: str, text: str) -> None:
    with pytest.raises(openai.BadRequestError, match=text):
        ask(client, url)


def test_decompression_bomb_is_a_400(client: OpenAI) -> None:
    buffer = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buffer, format="PNG")
    with pytest.raises(openai.BadRequestError, match="pixels"):
        ask(client, "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())


def test_vision_servable_refuses_completions_and_text_model_refuses_images(stack: Stack, client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="vision-language"):
        client.completions.create(model=VLM, prompt="hi", max_tokens=2)
    content = [{"type": "image_url", "image_url": {"url": data_url((1, 2, 3))}}]
    response = httpx.post(f"{stack.base_url}/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": content}]})
    assert response.status_code == 400


def test_npu_vision_servable_takes_exactly_one_image(stack: Stack) -> None:
    """OVMS's NPU VLM rule, checked in the API before queueing (no NPU here: the card is announced by hand)."""
    import time

    from common.modelcard import ModelCard
    from common.redis.client import sync_client
    from common.servable import ServableType
    from tests.conftest import test_keys

    keys, r = test_keys("ovqtest"), sync_client(stack.redis_url)
    card = ModelCard(name="npu-vlm", device="NPU", servable_type=ServableType.VLM, context_length=64,
                     chat_template="{{ messages[0]['content'] }}", created=0)
    r.hset(keys.model("npu-vlm"), "NPU", card.model_dump_json())
    r.zadd(keys.workers("npu-vlm", "NPU"), {"ghost": time.time() + 60})
    try:
        for count in (0, 2):
            content = [{"type": "image_url", "image_url": {"url": data_url((1, 1, 1))}}] * count
            content.append({"type": "text", "text": "hi"})
            response = httpx.post(f"{stack.base_url}/chat/completions", timeout=30,
                                  json={"model": "npu-vlm", "messages": [{"role": "user", "content": content}]})
            assert response.status_code == 400 and "exactly one image" in response.json()["error"]["message"]
        assert r.xlen(keys.jobs("npu-vlm", "NPU")) == 0
    finally:
        r.delete(keys.model("npu-vlm"), keys.workers("npu-vlm", "NPU"))


@pytest.fixture()
def media_server(stack: Stack):
    """A local HTTP server: /cat.png, /moved (a redirect to it), /huge (over the size cap)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    buffer = io.BytesIO()
    Image.new("RGB", (20, 20), (10, 200, 10)).save(buffer, format="PNG")
    png = buffer.getvalue()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/cat.png")
                self.end_headers()
                return
            body = png if self.path == "/cat.png" else b"\0" * (21 * 1024 * 1024)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", stack.media_port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_http_images_only_from_allowed_hosts_without_redirects(client: OpenAI, media_server: int) -> None:
    assert ask(client, f"http://localhost:{media_server}/cat.png").usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError, match="could not be fetched"):
        ask(client, f"http://localhost:{media_server}/moved")
    with pytest.raises(openai.BadRequestError, match="not in allowed_media_domains"):
        ask(client, f"http://127.0.0.1:{media_server}/cat.png")  # the same server, but not an allowed name
    with pytest.raises(openai.BadRequestError, match="bytes"):
        ask(client, f"http://localhost:{media_server}/huge")
