"""API keys, input limits, media allow-list and error texts: the pure parts, without a server."""
from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import httpx
import pytest

from api.http.auth import KeyFileError, KeySet, load_keys, presented_key, read_key_file
from api.openai.limits import check_sampling, media_type, require_media_type
from api.openai.media import allowed
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from cli.tiers import key_env
from common.errors import GENERIC, ErrorBody, OvqError, clean_message
from common.settings import Settings


def scope(authorization: bytes | None) -> dict:
    return {"headers": [(b"authorization", authorization)] if authorization is not None else []}


def test_keys_match_exactly_and_only_configured_ones() -> None:
    keys = KeySet(["sk-one", "sk-two"])
    assert keys.matches(b"sk-one") and keys.matches(b"sk-two")
    assert not keys.matches(b"sk-on") and not keys.matches(b"sk-one ") and not keys.matches(b"")
    assert not keys.matches(None)
    assert not KeySet([]).matches(b"anything") and not KeySet([])


def test_presented_key_bearer_and_basic() -> None:
    assert presented_key(scope(b"Bearer sk-1")) == b"sk-1"
    assert presented_key(scope(b"bearer   sk-1 ")) == b"sk-1"
    assert presented_key(scope(b"Basic " + base64.b64encode(b"admin:pw:with:colons"))) == b"pw:with:colons"
    assert presented_key(scope(b"Basic !!!")) is None
    assert presented_key(scope(b"Bearer")) is None
    assert presented_key(scope(b"Token sk-1")) is None
    assert presented_key(scope(None)) is None


def test_key_files_one_key_per_line(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("sk-a\n\n  sk-b  \n")
    assert read_key_file(tmp_path / "keys") == ["sk-a", "sk-b"]
    (tmp_path / "empty").write_text("\n \n")
    with pytest.raises(KeyFileError, match="holds no key"):
        read_key_file(tmp_path / "empty")
    with pytest.raises(KeyFileError, match="cannot read"):
        read_key_file(tmp_path / "missing")
    api, admin = load_keys(Settings(api_keys=["sk-c"], api_key_file=tmp_path / "keys", admin_keys=["adm"]))
    assert all(api.matches(k) for k in (b"sk-a", b"sk-b", b"sk-c")) and admin.matches(b"adm")
    assert not api.matches(b"adm") and not admin.matches(b"sk-a")


def test_keys_from_the_environment_json_or_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVQ_API_KEYS", "sk-a, sk-b")
    monkeypatch.setenv("OVQ_ADMIN_KEYS", '["adm,with,commas"]')
    settings = Settings()
    assert [k.get_secret_value() for k in settings.api_keys] == ["sk-a", "sk-b"]
    assert [k.get_secret_value() for k in settings.admin_keys] == ["adm,with,commas"]
    assert "sk-a" not in repr(settings) and "adm" not in str(settings.admin_keys)


def test_cli_passes_keys_as_environment(tmp_path: Path) -> None:
    args = argparse.Namespace(api_key=["sk-1", "sk-2"], admin_key=None, api_key_file="keys.txt", admin_key_file=None)
    env = key_env(args)
    assert json.loads(env["OVQ_API_KEYS"]) == ["sk-1", "sk-2"] and Path(env["OVQ_API_KEY_FILE"]).is_absolute()
    assert "OVQ_ADMIN_KEYS" not in env


@pytest.mark.parametrize(("header", "ok"), [
    ("application/json", True), ("application/json; charset=utf-8", True), ("Application/JSON", True),
    ("application/not-json-at-all", False), ("text/json", False), ("application/jsonx", False),
    ("application/x-www-form-urlencoded", False), ("", False), (None, False)])
def test_json_media_type_is_parsed_not_substring_matched(header: str | None, ok: bool) -> None:
    if ok:
        require_media_type(header, "application/json", "x")
    else:
        with pytest.raises(OvqError) as caught:
            require_media_type(header, "application/json", "x")
        assert caught.value.status == 415
    assert media_type("multipart/form-data; boundary=abc") == "multipart/form-data"


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 **fields})


LIMITS = Settings(max_message_chars=100, max_prompt_chars=150, max_stop_chars=10, max_schema_bytes=200,
                  max_echo_prompt_chars=50)


@pytest.mark.parametrize(("body", "param"), [
    (chat(messages=[{"role": "user", "content": "x" * 101}]), "messages.0.content"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x" * 101}]}]), "messages.0.content"),
    (chat(messages=[{"role": "user", "content": "x" * 80}, {"role": "assistant", "content": "y" * 80}]),
     "messages"),
    (chat(stop=["s" * 11]), "stop"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "description": "d" * 300}}}), "response_format"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "description": "d" * 300}}]), "tools"),
    (CompletionRequest(model="m", prompt="p" * 151), "prompt"),
    (CompletionRequest(model="m", prompt=list(range(151))), "prompt"),
    (CompletionRequest(model="m", prompt="p" * 51, echo=True, max_tokens=0), "prompt"),
])
def test_limits_name_the_field_and_the_setting(body: object, param: str) -> None:
    with pytest.raises(OvqError) as caught:
        check_sampling(body, LIMITS)
    assert caught.value.status == 400 and caught.value.body.param == param
    assert "OVQ_MAX_" in caught.value.body.message


def test_requests_within_the_limits_pass() -> None:
    check_sampling(chat(messages=[{"role": "user", "content": "x" * 100}], stop=["s" * 10]), LIMITS)
    check_sampling(CompletionRequest(model="m", prompt="p" * 50, echo=True, max_tokens=0), LIMITS)
    check_sampling(CompletionRequest(model="m", prompt="p" * 150), LIMITS)


@pytest.mark.parametrize(("url", "ok"), [
    ("http://localhost/a.png", True), ("http://localhost:80/a.png", True), ("https://localhost/a.png", True),
    ("http://localhost:8080/a.png", False), ("https://localhost:80/a.png", False),
    ("http://img.test:9000/a.png", True), ("https://img.test:9000/a.png", True), ("http://img.test/a.png", False),
    ("https://secure.test/a.png", True), ("http://secure.test/a.png", False), ("https://secure.test:8443/a", False),
    ("http://[::1]:7000/a", True), ("http://[::1]/a", False), ("http://LOCALHOST/a", True),
    ("http://localhost.evil.test/a", False), ("http://evil.test/a", False),
])
def test_allow_list_matches_scheme_host_and_port(url: str, ok: bool) -> None:
    entries = ["localhost", "img.test:9000", "https://secure.test", "[::1]:7000"]
    assert allowed(httpx.URL(url), entries) is ok


@pytest.mark.parametrize(("raw", "clean"), [
    ("Check 'width % 8 == 0' failed at /home/jenkins/b/repos/openvino.genai/src/cpp/src/x.hpp:489:\n"
     "Both 'width' and 'height' must be divisible by 8\n", "Both 'width' and 'height' must be divisible by 8"),
    ("Exception from src/inference/src/cpp/infer_request.cpp:223:\nPort for tensor name x was not found.",
     "Port for tensor name x was not found."),
    ("cannot identify image file <_io.BytesIO object at 0x7f2a1c3b>", "cannot identify image file"),
    ('File "/usr/lib/python3/site-packages/foo/bar.py", line 3', 'File "", line 3'),
    ("", GENERIC), ("   ", GENERIC),
    ("temperature out of range(0.0, 2.0)", "temperature out of range(0.0, 2.0)"),
])
def test_error_texts_carry_no_locations_reprs_or_emptiness(raw: str, clean: str) -> None:
    assert clean_message(raw) == clean
    assert ErrorBody(message=raw).message == clean
