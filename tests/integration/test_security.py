"""API keys on a second API process (`guarded`: same Redis and workers as the stack, keys and short timeouts)."""
from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from common.redis.client import sync_client
from tests.conftest import MODEL, Stack
from tests.integration.conftest import Guarded
from tests.integration.rawhttp import connect, read_response, request_head

HELLO = [{"role": "user", "content": "hi"}]
OPEN_PROBES = ["/health", "/v3/health", "/v1/health", "/v2/health/live", "/v2/health/ready",
               f"/v2/models/{MODEL}/ready"]
ADMIN_ROUTES = ["/metrics", "/docs", "/openapi.json", "/docs/assets/swagger-ui-bundle.js"]


def sdk(guarded: Guarded, key: str, prefix: str = "/v3") -> OpenAI:
    return OpenAI(base_url=guarded.url(prefix), api_key=key, max_retries=0, timeout=60)


@pytest.mark.parametrize("prefix", ["/v3", "/v1"])
def test_the_right_key_works_inline_or_from_the_key_file(guarded: Guarded, prefix: str) -> None:
    for key in (guarded.api_key, guarded.file_key):
        client = sdk(guarded, key, prefix)
        reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        assert reply.usage.completion_tokens <= 2
        assert MODEL in {m.id for m in client.models.list()}
        chunks = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True))
        assert chunks


# (The admin key is an operator's: it is accepted on the API routes too, and sees every tenant's objects there:
# tests/integration/test_tenant_isolation.py.)
@pytest.mark.parametrize("key", ["", "wrong", "sk-guarded-inlin", "sk-guarded-inline2", "adm-guarded2"])
def test_no_or_wrong_key_is_an_authentication_error(guarded: Guarded, key: str) -> None:
    if key:
        client = sdk(guarded, key)
    else:  # the SDK insists on a key: take its Authorization header off on the way out
        strip = httpx.Client(event_hooks={"request": [lambda request: request.headers.pop("Authorization")]})
        client = OpenAI(base_url=guarded.url("/v3"), api_key="x", max_retries=0, http_client=strip)
    for call in (lambda: client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2),
                 lambda: client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, stream=True),
                 lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=2),
                 lambda: client.models.list(),
                 lambda: client.images.generate(model="tiny-sd", prompt="x")):
        with pytest.raises(openai.AuthenticationError) as caught:
            call()
        error = caught.value.body
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error", error
        assert key not in error["message"] or not key


def test_refused_before_the_body_is_read(guarded: Guarded) -> None:
    """A request announcing a 1 MB body, none of it sent: the 401 comes back at once (nothing waits for the body)."""
    with connect(guarded.base) as s:
        s.sendall(request_head("POST", "/v3/chat/completions", {
            "Authorization": "Bearer wrong", "Content-Type": "application/json", "Content-Length": "1000000"}))
        status, _, body = read_response(s)
    assert status == 401 and b"invalid_api_key" in body, body


def test_health_probes_need_no_key(guarded: Guarded) -> None:
    for path in OPEN_PROBES:
        assert httpx.get(guarded.url(path), timeout=10).status_code == 200, path


def test_operator_routes_need_the_admin_key(guarded: Guarded) -> None:
    for path in ADMIN_ROUTES:
        assert httpx.get(guarded.url(path), timeout=10).status_code == 401, path
        api_key = {"Authorization": f"Bearer {guarded.api_key}"}
        assert httpx.get(guarded.url(path), headers=api_key, timeout=10).status_code == 401, path
        admin = httpx.get(guarded.url(path), headers={"Authorization": f"Bearer {guarded.admin_key}"}, timeout=10)
        assert admin.status_code == 200, path
        browser = httpx.get(guarded.url(path), auth=("admin", guarded.admin_key), timeout=10)  # HTTP Basic
        assert browser.status_code == 200, path
    refused = httpx.get(guarded.url("/metrics"), timeout=10)
    assert refused.headers["www-authenticate"].startswith("Basic")


def test_unknown_paths_need_a_key_too(guarded: Guarded) -> None:
    assert httpx.get(guarded.url("/nothing-here"), timeout=10).status_code == 401
    headers = {"Authorization": f"Bearer {guarded.api_key}"}
    assert httpx.get(guarded.url("/nothing-here"), headers=headers, timeout=10).status_code == 404


def test_docs_are_served_offline_with_request_bodies(stack: Stack) -> None:
    """Without keys (the stack) the operator routes are open; /docs loads nothing from another host."""
    page = httpx.get(stack.url("/docs"), timeout=10)
    assert page.status_code == 200
    assert "http://" not in page.text and "https://" not in page.text
    assert httpx.get(stack.url("/docs/assets/swagger-ui-bundle.js"), timeout=10).status_code == 200
    assert httpx.get(stack.url("/docs/assets/swagger-ui.css"), timeout=10).status_code == 200
    schema = httpx.get(stack.url("/openapi.json"), timeout=10).json()
    body = schema["paths"]["/v3/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in body["properties"]
    assert "multipart/form-data" in schema["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_keys_never_reach_logs_metrics_or_redis(stack: Stack, guarded: Guarded) -> None:
    secrets = [guarded.api_key, guarded.file_key, guarded.admin_key]
    client = sdk(guarded, guarded.api_key)
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, stream=True))
    with pytest.raises(openai.AuthenticationError):
        sdk(guarded, "sk-wrong-and-logged?").models.list()
    metrics = httpx.get(guarded.url("/metrics"), headers={"Authorization": f"Bearer {guarded.admin_key}"}).text
    logs = "".join(p.read_text(errors="replace") for p in stack.logs.rglob("*.log"))
    r = sync_client(stack.redis_url)
    stored = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        if kind == b"hash":
            stored += r.hgetall(key).values()
        elif kind == b"string":
            stored.append(r.get(key) or b"")
        elif kind == b"stream":
            stored += [str(fields).encode() for _, fields in r.xrange(key, count=1000)]
    dump = b"\n".join(stored).decode(errors="replace")
    for secret in [*secrets, "sk-wrong-and-logged?"]:
        assert secret not in metrics and secret not in logs and secret not in dump, secret
