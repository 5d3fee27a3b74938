"""Hostile input: each refused with a clean 4xx before anything is queued, and a normal request right after works.

Every test tallies what it sent: accepted (answered), completed (2xx), failed with a clean error (4xx in the
OpenAI envelope), hung (no answer in time: must be 0) and 5xx (must be 0).
"""
from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from PIL import Image

from api.openai.media import FETCH_FAILED
from common.redis.client import sync_client
from tests.conftest import MODEL, UNRESOLVABLE, VLM, Stack, free_port
from tests.integration.conftest import Guarded
from tests.integration.counts import Tally
from tests.integration.rawhttp import closed_by_peer, connect, read_response, request_head

HELLO = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}


def send(tally: Tally, method: str, url: str, **kwargs: object) -> httpx.Response | None:
    try:
        return tally.record(httpx.request(method, url, timeout=60, **kwargs))
    except httpx.TimeoutException:
        return tally.record(None)


def normal(tally: Tally, stack: Stack) -> None:
    """The request that must succeed after each hostile one."""
    response = send(tally, "POST", stack.base_url + "/chat/completions",
                    json={"model": MODEL, "messages": HELLO, "max_tokens": 2})
    assert response is not None and response.status_code == 200, response and response.text


def words(n: int) -> str:
    return "word " * n


BIG_SCHEMA = {"type": "object", "properties": {f"field_{i:05d}": {"type": "string", "description": "d" * 40}
                                               for i in range(4500)}}
HOSTILE: list[tuple[str, str, object, int, str | None]] = [
    ("stop 16 x 1 MB", "/chat/completions",
     {"model": MODEL, "messages": HELLO, "stop": ["s" * 1_000_000] * 16, "max_tokens": 4}, 400, "stop"),
    ("289 KB response_format schema", "/chat/completions",
     {"model": MODEL, "messages": HELLO, "max_tokens": 4,
      "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": BIG_SCHEMA}}},
     400, "response_format"),
    ("289 KB of tools", "/chat/completions",
     {"model": MODEL, "messages": HELLO, "max_tokens": 4,
      "tools": [{"type": "function", "function": {"name": "f", "parameters": BIG_SCHEMA}}]}, 400, "tools"),
    ("200,000-word message", "/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": words(200_000)}], "max_tokens": 4},
     400, "messages.0.content"),
    ("200,000 words over many messages", "/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": words(50_000)}] * 4, "max_tokens": 4},
     400, "messages"),
    ("echo + logprobs on a 6,000-word prompt", "/completions",
     {"model": MODEL, "prompt": words(6_000), "echo": True, "logprobs": 1, "max_tokens": 1}, 400, "prompt"),
    ("200,000-word completion prompt", "/completions",
     {"model": MODEL, "prompt": words(200_000), "max_tokens": 1}, 400, "prompt"),
    ("600,000 prompt token ids", "/completions", {"model": MODEL, "prompt": [1] * 600_000, "max_tokens": 1},
     400, "prompt"),
    ("200,000-word image prompt", "/images/generations", {"model": "tiny-sd", "prompt": words(200_000)},
     400, "prompt"),
    ("null byte in a local image path", "/chat/completions",
     {"model": VLM, "max_tokens": 2, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "cat\x00.png"}}]}]},
     400, "messages"),
    ("null byte in a file URL", "/chat/completions",
     {"model": VLM, "max_tokens": 2, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "file:///tmp/a%00b.png"}}]}]},
     400, "messages"),
    ("a path too long for the file system", "/chat/completions",
     {"model": VLM, "max_tokens": 2, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "a" * 5000}}]}]},
     400, "messages"),
]


@pytest.mark.parametrize(("name", "path", "body", "status", "param"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_bodies_are_refused_before_queueing(stack: Stack, name: str, path: str, body: object, status: int,
                                                    param: str | None) -> None:
    tally = Tally()
    response = send(tally, "POST", stack.base_url + path, content=json.dumps(body), headers=JSON)
    assert response is not None and response.status_code == status, response and response.text[:300]
    error = response.json()["error"]
    assert error["param"] == param, error
    assert any(text in error["message"] for text in ("OVQ_MAX_", "null byte", "at that path")), error
    normal(tally, stack)
    tally.check()


@pytest.mark.parametrize("content_type", [
    "application/not-json-at-all", "text/plain", "application/json-patch+json", "text/json",
    "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", None])
def test_odd_content_types_are_415s(stack: Stack, content_type: str | None) -> None:
    tally = Tally()
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/chat/completions", "/completions", "/images/generations"):
        body = json.dumps({"model": MODEL, "messages": HELLO, "prompt": "hi", "max_tokens": 2})
        response = send(tally, "POST", stack.base_url + path, content=body, headers=headers)
        assert response is not None and response.status_code == 415, (path, response and response.text)
    edit = send(tally, "POST", stack.base_url + "/images/edits", json={"model": "tiny-sd", "prompt": "x"})
    assert edit is not None and edit.status_code == 415
    normal(tally, stack)
    tally.check()


def test_json_with_parameters_is_json(stack: Stack) -> None:
    tally = Tally()
    response = send(tally, "POST", stack.base_url + "/chat/completions", headers={
        "Content-Type": "application/json; charset=utf-8"}, content=json.dumps(
        {"model": MODEL, "messages": HELLO, "max_tokens": 2}))
    assert response is not None and response.status_code == 200
    tally.check()


def test_a_50_mb_body_is_refused_unread(stack: Stack) -> None:
    tally = Tally()
    # Announced: the answer comes before a byte of the body is sent.
    with connect(stack.base_url) as s:
        s.sendall(request_head("POST", "/v3/chat/completions", {**JSON, "Content-Length": str(50 * 2**20)}))
        status, _, body = read_response(s)
        tally.accepted += 1
        tally.clean += status == 413
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        assert closed_by_peer(s, 10)
    # Chunked, so no length up front: refused once the cap is passed, long before the 50 MB are through.
    sent = 0
    with connect(stack.base_url, timeout=30) as s:
        s.sendall(request_head("POST", "/v3/chat/completions", {**JSON, "Transfer-Encoding": "chunked"}))
        chunk = b"%x\r\n" % 2**20 + b" " * 2**20 + b"\r\n"
        try:
            while sent < 50 * 2**20:
                s.sendall(chunk)
                sent += 2**20
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.settimeout(30)
        status, _, body = read_response(s)
    tally.accepted += 1
    tally.clean += status == 413
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large", body
    assert sent < 50 * 2**20, "the server read the whole body"
    normal(tally, stack)
    tally.check()


# ---- media: allow-list by scheme, host and port; one message for every failed fetch --------------------------


class MediaServer:
    """A local HTTP server whose behaviour the test switches: a PNG, 404, a redirect, or never answering."""

    def __init__(self, port: int) -> None:
        buffer = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 10, 10)).save(buffer, format="PNG")
        self.png, self.mode, self.hits = buffer.getvalue(), "png", 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server.hits += 1
                if server.mode == "hang":
                    time.sleep(6)
                    return
                if server.mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "/cat.png")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body, code = (server.png, 200) if server.mode == "png" else (b"no", 404)
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def servers(stack: Stack) -> Iterator[tuple[MediaServer, MediaServer]]:
    """One on the allowed port of localhost, one on a port that is not allowed."""
    allowed, other = MediaServer(stack.media_port), MediaServer(free_port())
    yield allowed, other
    allowed.close()
    other.close()


def vision(stack: Stack, url: str) -> Callable[[Tally], httpx.Response | None]:
    body = {"model": VLM, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    return lambda tally: send(tally, "POST", stack.base_url + "/chat/completions", json=body)


def test_media_allow_list_matches_host_and_port(stack: Stack, servers: tuple[MediaServer, MediaServer]) -> None:
    allowed, other = servers
    port, other_port = stack.media_port, other.httpd.server_address[1]
    tally = Tally()
    assert vision(stack, f"http://localhost:{port}/cat.png")(tally).status_code == 200
    tricks = [f"http://localhost:{other_port}/cat.png", "http://localhost/cat.png",
              f"http://127.0.0.1:{port}/cat.png", f"http://127.0.0.1:{other_port}/cat.png",
              f"http://localhost:{port}@127.0.0.1:{other_port}/cat.png",
              f"http://127.0.0.1:{other_port}\\@localhost:{port}/cat.png",
              f"http://localhost.:{other_port}/cat.png", f"http://[::1]:{other_port}/cat.png",
              f"http://0x7f000001:{other_port}/cat.png", f"http://LOCALHOST:{other_port}/cat.png"]
    for url in tricks:
        response = vision(stack, url)(tally)
        assert response.status_code == 400, (url, response.text)
        assert FETCH_FAILED not in response.text, url  # refused before any fetch
    assert other.hits == 0, "a server on a port that is not allowed was contacted"
    assert vision(stack, f"http://localhost:{port}/cat.png")(tally).status_code == 200
    tally.check()


def test_every_failed_fetch_says_the_same(stack: Stack, servers: tuple[MediaServer, MediaServer]) -> None:
    """Closed port, 404, redirect, a server that never answers, a name that resolves nowhere, TLS to plain HTTP:
    one message, so the API cannot be used as a port or host scanner."""
    allowed, _ = servers
    port = stack.media_port
    tally, messages = Tally(), {}
    for mode in ("404", "redirect", "hang"):
        allowed.mode = mode
        messages[mode] = vision(stack, f"http://localhost:{port}/cat.png")(tally).json()["error"]["message"]
    messages["tls"] = vision(stack, f"https://localhost:{port}/cat.png")(tally).json()["error"]["message"]
    messages["dns"] = vision(stack, f"http://{UNRESOLVABLE}/cat.png")(tally).json()["error"]["message"]
    allowed.close()
    messages["closed"] = vision(stack, f"http://localhost:{port}/cat.png")(tally).json()["error"]["message"]
    assert set(messages.values()) == {FETCH_FAILED}, messages
    normal(tally, stack)
    tally.check()
    assert tally.clean == len(messages)


# ---- HTTP timeouts and clients that leave (the guarded API: header 2 s, body 3 s, write 2 s, keep-alive 2 s) --


def test_an_idle_connection_is_closed(guarded: Guarded) -> None:
    with connect(guarded.base) as s:
        assert closed_by_peer(s, guarded.timeouts["header"] + 10)


def test_slowloris_is_closed(guarded: Guarded) -> None:
    """Headers a line every half second: closed once the header timeout passes, however long the trickle."""
    closed = False
    with connect(guarded.base) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: ovq\r\n")
        for _ in range(40):  # 20 s of trickling at most
            time.sleep(0.5)
            try:
                s.sendall(b"X-Slow: yes\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        closed = closed or closed_by_peer(s, 1)
    assert closed


def test_a_body_that_never_comes_is_closed_and_logged_as_499(guarded: Guarded) -> None:
    with connect(guarded.base) as s:
        s.sendall(request_head("POST", "/v3/chat/completions", {
            **JSON, "Authorization": f"Bearer {guarded.api_key}", "Content-Length": "1000"}) + b'{"model"')
        assert closed_by_peer(s, guarded.timeouts["body"] + 10)


def test_a_client_that_leaves_mid_body_is_a_499_without_traceback(guarded: Guarded) -> None:
    before = guarded.log.read_text().count(" 499: ")
    with connect(guarded.base) as s:
        s.sendall(request_head("POST", "/v3/chat/completions", {
            **JSON, "Authorization": f"Bearer {guarded.api_key}", "Content-Length": "100000"}) + b'{"model": ')
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while guarded.log.read_text().count(" 499: ") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    text = guarded.log.read_text()
    assert text.count(" 499: ") > before
    assert "Traceback" not in text and "Exception in ASGI application" not in text


def test_keep_alive_connections_are_closed_when_idle(guarded: Guarded) -> None:
    with connect(guarded.base) as s:
        s.sendall(request_head("GET", "/health", {}))
        status, _, _ = read_response(s)
        assert status == 200
        assert closed_by_peer(s, guarded.timeouts["keep_alive"] + 10)


def test_a_stream_nobody_reads_is_ended_and_its_job_cancelled(stack: Stack, guarded: Guarded) -> None:
    """Image previews fill the socket buffers (32 KB on the server's side here); the client reads nothing, so the
    write timeout cuts the connection and the job is cancelled."""
    r = sync_client(stack.redis_url)
    cancels_before = set(r.scan_iter("ovqtest:cancel:*"))
    body = json.dumps({"model": "tiny-sd", "prompt": "noise", "n": 3, "size": "256x256",
                       "num_inference_steps": 100, "stream": True}).encode()
    with connect(guarded.base, rcvbuf=4096) as s:
        s.sendall(request_head("POST", "/v3/images/generations", {
            **JSON, "Authorization": f"Bearer {guarded.api_key}", "Content-Length": str(len(body))}) + body)
        deadline, cancelled = time.monotonic() + 60, set()
        while not cancelled and time.monotonic() < deadline:
            time.sleep(0.2)
            cancelled = set(r.scan_iter("ovqtest:cancel:*")) - cancels_before
        assert cancelled, "the job of a stream nobody reads was not cancelled"
        assert closed_by_peer(s, 30)
    client = httpx.post(guarded.url("/v3/chat/completions"), timeout=60, headers={
        "Authorization": f"Bearer {guarded.api_key}"}, json={"model": MODEL, "messages": HELLO, "max_tokens": 2})
    assert client.status_code == 200
