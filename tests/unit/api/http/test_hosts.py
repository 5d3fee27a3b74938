"""The Host check (DNS rebinding) and the cross-site check, on the ASGI layer itself."""
from __future__ import annotations

import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send

from api.http.hosts import HostGuard, host_name
from common.settings import Settings


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def answer(guard: HostGuard, method: str = "GET", path: str = "/v1/models",
                 **headers: str) -> tuple[int, dict]:
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]}
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    await guard(scope, receive, send)
    body = sent[1]["body"]
    return sent[0]["status"], orjson.loads(body) if body != b"ok" else {}


@pytest.mark.parametrize(("host", "name"), [("localhost:8000", "localhost"), ("[::1]:8000", "::1"),
                                            ("127.0.0.1", "127.0.0.1"), ("Evil.Example:80", "evil.example")])
def test_host_names_lose_their_port(host: str, name: str) -> None:
    assert host_name(host) == name


@pytest.mark.parametrize(("host", "status"), [
    ("localhost:8000", 200), ("127.0.0.1:8000", 200), ("[::1]:8000", 200), ("app.localhost", 200),
    ("ovq.internal:8000", 200), ("evil.example:8000", 403), ("evil.example", 403), ("127.0.0.1.evil.example", 403),
    ("localhost.evil.example", 403)])
async def test_a_loopback_api_answers_only_its_names(host: str, status: int) -> None:
    guard = HostGuard(ok, Settings(host="127.0.0.1", allowed_hosts=["ovq.internal"]))
    for path in ("/v1/models", "/v3/chat/completions", "/ops"):
        got, body = await answer(guard, "POST" if "chat" in path else "GET", path, host=host)
        assert got == status, (host, path)
        assert status == 200 or body["error"]["code"] == "host_not_allowed"
    assert (await answer(guard, path="/health", host=host))[0] == 200  # probes come by address


async def test_off_loopback_the_host_is_checked_only_when_names_are_set() -> None:
    assert (await answer(HostGuard(ok, Settings(host="0.0.0.0")), host="anything.example"))[0] == 200
    guard = HostGuard(ok, Settings(host="10.0.0.5", allowed_hosts="ovq.example.org, other.example"))
    for host, status in (("ovq.example.org", 200), ("other.example:443", 200), ("10.0.0.5:8000", 200),
                         ("elsewhere.example", 403)):
        assert (await answer(guard, host=host))[0] == status, host
    assert (await answer(HostGuard(ok, Settings(allowed_hosts=["*"])), host="any.example"))[0] == 200


@pytest.mark.parametrize(("headers", "status"), [
    ({"sec_fetch_site": "cross-site", "origin": "http://evil.example"}, 403), ({"sec_fetch_site": "same-site"}, 403),
    ({"origin": "http://evil.example"}, 403), ({"origin": "null"}, 403), ({"origin": "http://localhost:9999"}, 403),
    ({"sec_fetch_site": "same-origin"}, 200), ({"sec_fetch_site": "none"}, 200),
    ({"origin": "http://localhost:8000"}, 200), ({}, 200)])
async def test_changes_from_another_site_are_refused(headers: dict[str, str], status: int) -> None:
    guard = HostGuard(ok, Settings())
    for method, path in (("POST", "/ops/dead/purge"), ("DELETE", "/v1/files/file-1"), ("POST", "/v1/batches")):
        got, body = await answer(guard, method, path, host="localhost:8000", **headers)
        assert got == status, (headers, path)
        assert status == 200 or body["error"]["code"] == "cross_site_request"
    assert (await answer(guard, "GET", "/ops", host="localhost:8000", **headers))[0] == 200  # reading changes nothing
