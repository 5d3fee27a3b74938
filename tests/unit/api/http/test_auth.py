"""Protected mode: which bind addresses count as this machine only, and when an API without keys may start."""
from __future__ import annotations

from pathlib import Path

import pytest

from api.http.auth import (
    CALLER_STATE,
    ApiKeyMiddleware,
    KeyAttributes,
    KeyFileError,
    KeySet,
    exposure_refusal,
    is_loopback,
    read_key_file,
    read_keys,
)
from common.owner import OPERATOR, Caller
from common.settings import Settings

NO_KEYS = (KeySet([]), KeySet([]))


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LocalHost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("example.org", False),
    ("", False), ("localhost.example.org", False)])
def test_only_loopback_addresses_count_as_local(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_open_api_off_loopback_is_refused_with_what_to_do() -> None:
    refusal = exposure_refusal(Settings(host="0.0.0.0", port=8000), NO_KEYS)
    assert refusal is not None and "\n" not in refusal
    for hint in ("0.0.0.0:8000", "--api-key", "OVQ_API_KEYS", "OVQ_API_KEY_FILE", "--allow-unauthenticated",
                 "OVQ_ALLOW_UNAUTHENTICATED", "127.0.0.1"):
        assert hint in refusal


def test_a_key_loopback_or_the_explicit_setting_lets_it_start() -> None:
    assert exposure_refusal(Settings(host="0.0.0.0"), (KeySet(["sk-1"]), KeySet([]))) is None
    assert exposure_refusal(Settings(host="127.0.0.1"), NO_KEYS) is None
    assert exposure_refusal(Settings(host="0.0.0.0", allow_unauthenticated=True), NO_KEYS) is None


def test_an_admin_key_alone_does_not_protect_the_api_routes() -> None:
    assert exposure_refusal(Settings(host="0.0.0.0"), (KeySet([]), KeySet(["adm-1"]))) is not None


def test_the_setting_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVQ_ALLOW_UNAUTHENTICATED", "1")
    assert Settings().allow_unauthenticated is True
    monkeypatch.delenv("OVQ_ALLOW_UNAUTHENTICATED")
    assert Settings().allow_unauthenticated is False


def test_structured_key_files_give_each_key_its_attributes(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(
        "keys:\n  - {key: sk-a, tenant: alpha, max_priority: high, weight: 2, tokens_per_min: 6000}\n"
        "  - key: sk-b\n    name: bee\n")
    (tmp_path / "keys.json").write_text('{"keys": [{"key": "sk-c"}]}')
    a, b = read_keys(tmp_path / "keys.yaml")
    assert (a.who, a.max_priority, a.weight, a.tokens_per_min) == ("alpha", "high", 2, 6000)
    assert (b.who, b.max_priority, b.weight, b.tokens_per_min) == ("bee", "interactive", 1, None)
    [c] = read_keys(tmp_path / "keys.json")
    assert c.who.startswith("key-") and "sk-c" not in c.who
    assert read_key_file(tmp_path / "keys.yaml") == ["sk-a", "sk-b"]
    found = KeySet([a, b, "sk-plain"])
    assert found.find(b"sk-a") is a and found.find(b"sk-b") is b and found.find(b"sk-x") is None
    assert found.find(b"sk-plain").who.startswith("key-") and found.find(None) is None
    (tmp_path / "bad.yaml").write_text("keys:\n  - {key: sk-secret, max_priority: god}\n")
    with pytest.raises(KeyFileError) as caught:
        read_keys(tmp_path / "bad.yaml")
    assert "sk-secret" not in str(caught.value)


async def _caller(keys: tuple[KeySet, KeySet], path: str, key: str | None) -> object:
    seen: dict[str, object] = {}

    async def app(scope, receive, send) -> None:  # noqa: ANN001 - an ASGI app
        seen["caller"] = scope.get("state", {}).get(CALLER_STATE)

    async def send(message) -> None:  # noqa: ANN001
        seen["status"] = message.get("status", seen.get("status"))

    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    await ApiKeyMiddleware(app, keys)({"type": "http", "path": path, "headers": headers}, None, send)
    return seen.get("caller", seen.get("status"))


async def test_each_request_gets_its_caller() -> None:
    """An API key's tenant sees its own; the admin key, also on /v1, sees everything; keys off, one tenant."""
    keys = (KeySet([KeyAttributes(key="sk-a", tenant="alpha"), "sk-plain"]), KeySet(["adm-1"]))
    assert await _caller(keys, "/v1/files", "sk-a") == Caller("alpha")
    plain = await _caller(keys, "/v1/files", "sk-plain")
    assert isinstance(plain, Caller) and plain.tenant.startswith("key-") and not plain.admin
    admin = await _caller(keys, "/v1/files", "adm-1")
    assert isinstance(admin, Caller) and admin.admin
    assert await _caller(keys, "/ops/panel", "adm-1") == OPERATOR
    assert await _caller(keys, "/v1/files", "wrong") == 401
    assert await _caller(NO_KEYS, "/v3/batches", None) == OPERATOR
