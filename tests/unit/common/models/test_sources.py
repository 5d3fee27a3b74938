from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from common.models.sources import DEFAULT_MODEL, TOOLS_CHAT_TEMPLATE, configured_models, load_models
from common.settings import Settings


def test_yaml_models_file_with_ovms_options(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(
        "models:\n"
        "  m:\n"
        "    path: relative/dir\n"
        "    devices: GPU\n"
        "    plugin_config: '{\"KV_CACHE_PRECISION\": \"u8\"}'\n"
        "    cache_eviction_config: {start_size: 32, recent_size: 128, max_cache_size: 672}\n"
    )
    (model,) = load_models(tmp_path / "models.yaml")
    assert model.path == tmp_path / "relative/dir"
    assert model.devices == ["GPU"]
    assert model.plugin_config == {"KV_CACHE_PRECISION": "u8"}
    assert (model.max_num_batched_tokens, model.cache_size, model.max_num_seqs) == (256, 8, 256)
    assert model.dynamic_split_fuse and not model.enable_prefix_caching and model.best_of_limit == 20
    assert model.cache_eviction_config.max_cache_size == 672


def test_json_models_file_and_unknown_option(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"models": {"m": {"path": "/x", "max_num_seqs": 4}}}')
    assert load_models(tmp_path / "m.json")[0].max_num_seqs == 4
    (tmp_path / "bad.json").write_text('{"models": {"m": {"path": "/x", "max_num_seq": 4}}}')
    with pytest.raises(ValidationError):
        load_models(tmp_path / "bad.json")


def test_default_model_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", "redis://example:1/0")
    settings = Settings()
    assert settings.redis_url == "redis://example:1/0"
    (model,) = configured_models(settings)
    assert model.name == DEFAULT_MODEL and model.path == tmp_path / "models" / DEFAULT_MODEL


def test_default_model_serves_tools_with_the_shipped_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.openai.templates import render

    monkeypatch.setenv("OVQ_CACHE_DIR", str(tmp_path))
    (model,) = configured_models(Settings())
    assert model.tool_parser == "hermes3" and model.chat_template == TOOLS_CHAT_TEMPLATE
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": "sunny"}]
    prompt = render(TOOLS_CHAT_TEMPLATE.read_text(), messages, "", "", {"tools": tools})
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_the_shipped_template_is_package_data() -> None:
    text = (Path(__file__).resolve().parents[4] / "pyproject.toml").read_text()  # tomllib needs Python 3.11
    section = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    globs = re.search(r"^\"common.models\" = \[(.*?)\]", section, re.M).group(1).replace('"', "").split(",")
    relative = TOOLS_CHAT_TEMPLATE.relative_to(TOOLS_CHAT_TEMPLATE.parents[1])
    assert any(relative.match(glob.strip()) for glob in globs)


def test_a_models_file_chat_template_is_relative_to_it_and_wins(tmp_path: Path) -> None:
    from workers.text.servable_info import ServableInfo

    tiny = Path(__file__).resolve().parents[3] / "models" / "tiny-llama"
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}!")
    (tmp_path / "m.json").write_text(f'{{"models": {{"m": {{"path": "{tiny}", "chat_template": "t.jinja"}}}}}}')
    (model,) = load_models(tmp_path / "m.json")
    assert model.chat_template == tmp_path / "t.jinja"
    assert ServableInfo.load(tiny, model, "CPU").card.chat_template == "{{ messages[0]['content'] }}!"


def test_max_tokens_default_is_a_positive_count(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"models": {"m": {"path": "/x", "max_tokens_default": 256}}}')
    assert load_models(tmp_path / "m.json")[0].max_tokens_default == 256
    (tmp_path / "bad.json").write_text('{"models": {"m": {"path": "/x", "max_tokens_default": 0}}}')
    with pytest.raises(ValidationError):
        load_models(tmp_path / "bad.json")
