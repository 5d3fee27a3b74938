"""Protected mode: which bind addresses count as this machine only, and when an API without keys may start."""
from __future__ import annotations

import pytest

from api.http.auth import KeySet, exposure_refusal, is_loopback
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
