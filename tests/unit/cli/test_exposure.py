"""`--allow-unauthenticated`: parsed by `ovq api` and `ovq serve`, passed on as the setting, and serve's own check."""
from __future__ import annotations

from pathlib import Path

import pytest

from cli import exposure
from cli.main import parser as build_parser


@pytest.mark.parametrize("command", ["api", "serve"])
def test_the_flag_becomes_the_setting(command: str) -> None:
    parser = build_parser()
    assert exposure.env(parser.parse_args([command, "--allow-unauthenticated"])) == {
        "OVQ_ALLOW_UNAUTHENTICATED": "1"}
    assert exposure.env(parser.parse_args([command])) == {}


def test_serve_refuses_what_the_api_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OVQ_HOST", "OVQ_API_KEYS", "OVQ_API_KEY_FILE", "OVQ_ALLOW_UNAUTHENTICATED"):
        monkeypatch.delenv(name, raising=False)
    assert exposure.refusal({}) is None  # the default host is loopback
    assert "0.0.0.0" in (exposure.refusal({"OVQ_HOST": "0.0.0.0"}) or "")
    assert exposure.refusal({"OVQ_HOST": "0.0.0.0", "OVQ_API_KEYS": '["sk-1"]'}) is None
    keys = tmp_path / "keys"
    keys.write_text("sk-2\n")
    assert exposure.refusal({"OVQ_HOST": "0.0.0.0", "OVQ_API_KEY_FILE": str(keys)}) is None
    assert exposure.refusal({"OVQ_HOST": "::", "OVQ_ALLOW_UNAUTHENTICATED": "1"}) is None
