"""An OVMS model repository read as ovq's models: `config.json` and each servable's `graph.pbtxt` become the
`ModelConfig`s a models file would give, so nothing downstream knows where a model came from.

Paths resolve as OVMS resolves them: `base_path` against the config's directory (default: the servable's name),
`graph_path` against `base_path` (default `graph.pbtxt`), a relative `models_path` against `base_path`. The graph is
protobuf text format, parsed by protobuf with OVMS's message definitions (`common.models.ovms_proto`); its calculator
says text or image. An option ovq does not know is a warning naming its file and line; anything OVMS would refuse
is a `ConfigError` naming the file (and line and column where there is one).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message
from pydantic import ValidationError

from common.models import ovms_proto
from common.models.config import ConfigError, ModelConfig
from common.servable import VISION_FILES, ServableType, speech_servable

LLM_CALCULATOR = "LLMCalculator"  # OVMS matches the suffix: HttpLLMCalculator
IMAGE_CALCULATOR = "ImageGenCalculator"
S2T_CALCULATOR = "S2tCalculator"
T2S_CALCULATOR = "T2sCalculator"
EMBEDDINGS_CALCULATOR = "EmbeddingsCalculatorOV"
RERANK_CALCULATOR = "RerankCalculatorOV"
_OPTIONS_OF = {LLM_CALCULATOR: ovms_proto.LLM_OPTIONS, IMAGE_CALCULATOR: ovms_proto.IMAGE_OPTIONS,
               S2T_CALCULATOR: ovms_proto.S2T_OPTIONS, T2S_CALCULATOR: ovms_proto.T2S_OPTIONS,
               EMBEDDINGS_CALCULATOR: ovms_proto.EMBEDDINGS_OPTIONS, RERANK_CALCULATOR: ovms_proto.RERANK_OPTIONS}
# The speech and encoder calculators name their device `target_device`; the generation ones `device`.
_DEVICE_OPTION = {S2T_CALCULATOR: "target_device", T2S_CALCULATOR: "target_device",
                  EMBEDDINGS_CALCULATOR: "target_device", RERANK_CALCULATOR: "target_device"}
_SPEECH_TYPES = {S2T_CALCULATOR: ServableType.S2T, T2S_CALCULATOR: ServableType.T2S}
_PIPELINE_OF = {EMBEDDINGS_CALCULATOR: "EMBEDDINGS", RERANK_CALCULATOR: "RERANK"}
_REMOTE = ("s3://", "gs://", "azfs://", "azure://")
# OVMS options (2025-2026 releases) that ovq does not implement, to say so rather than "unknown".
OVMS_ONLY_OPTIONS = frozenset({
    "draft_eagle3_mode", "sparse_attention_config",
    "cache_interval_multiplier", "chat_template_mode", "generation_config_path", "snapkv_window_size",
    "kv_crush_config", "resolution", "num_images_per_prompt", "guidance_scale", "lora_adapters",  # (LLM graphs)
    "composite_lora_adapters",
})
# The older page's `response_parser` (seed 000) named one parser for both tools and reasoning.
_RESPONSE_PARSERS = {"hermes3": ("hermes3", None), "llama3": ("llama3", None), "phi4": ("phi4", None),
                     "qwen3": ("hermes3", "qwen3")}
_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_UNKNOWN_TYPE = re.compile(r"Type ([\w.]+) not found in descriptor pool")


@dataclass
class OvmsImport:
    models: list[ModelConfig]
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Graph:
    path: Path
    text: str
    message: Message

    def line_of(self, option: str) -> int:
        """The first line setting `option` (for value errors; protobuf keeps no positions)."""
        pattern = re.compile(rf"^[^#]*\b{re.escape(option)}\s*[:{{]")
        return next((n for n, line in enumerate(self.text.splitlines(), 1) if pattern.match(line)), 1)

    def error(self, option: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}:{self.line_of(option)}: {message}")


def load_ovms(config_path: Path) -> OvmsImport:
    """Every text and image generation servable of an OVMS `config.json` (or a directory holding one)."""
    config_path = Path(os.path.abspath(config_path))
    if config_path.is_dir():
        config_path = config_path / "config.json"
    data = _read_config(config_path)
    warnings: list[str] = []
    models: list[ModelConfig] = []
    for entry in _graph_entries(config_path, data, warnings):
        model = _servable(config_path, entry, warnings)
        if model is None:
            continue
        if any(m.name == model.name for m in models):
            raise ConfigError(f"{config_path}: servable name {model.name!r} is used twice")
        models.append(model)
    if not models:
        raise ConfigError(f"{config_path}: no text or image generation servable to serve")
    return OvmsImport(models, warnings)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such OVMS config file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: an OVMS config is a JSON object")
    return data


def _graph_entries(config_path: Path, data: dict[str, Any], warnings: list[str]) -> list[dict[str, Any]]:
    """`mediapipe_config_list`, plus `model_config_list` entries whose base path holds a graph (as OVMS's
    `--add_to_config` writes them); everything else in the file is not served by ovq."""
    entries = []
    for entry in _list(config_path, data, "mediapipe_config_list"):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ConfigError(f"{config_path}: each mediapipe_config_list entry needs a name")
        entries.append(entry)
    for item in _list(config_path, data, "model_config_list"):
        entry = item.get("config") if isinstance(item, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{config_path}: each model_config_list entry needs a config with a name")
        if (_base_path(config_path, entry) / "graph.pbtxt").is_file():
            entries.append({k: v for k, v in entry.items() if k in ("name", "base_path")})
        else:
            warnings.append(f"{config_path}: model {entry['name']!r} has no graph.pbtxt (a classic OpenVINO "
                            "model): ovq serves text and image generation graphs only; skipped")
    for key in data.keys() - {"mediapipe_config_list", "model_config_list"}:
        warnings.append(f"{config_path}: {key!r} is not used by ovq; ignored")
    return entries


def _list(config_path: Path, data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{config_path}: {key} must be a list")
    return value


def _base_path(config_path: Path, entry: dict[str, Any]) -> Path:
    base = entry.get("base_path") or entry["name"]
    if not isinstance(base, str) or base.startswith(_REMOTE):
        raise ConfigError(f"{config_path}: base_path of {entry['name']!r} must be a local directory, not {base!r}")
    return Path(os.path.normpath(config_path.parent / base))


def _servable(config_path: Path, entry: dict[str, Any], warnings: list[str]) -> ModelConfig | None:
    name = entry["name"]
    base = _base_path(config_path, entry)
    graph_path = Path(os.path.normpath(base / entry.get("graph_path", "graph.pbtxt")))
    if "subconfig" in entry:
        warnings.append(f"{config_path}: subconfig of {name!r} (classic models inside a graph) is not used by ovq")
    try:
        text = graph_path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{config_path}: graph of {name!r} not found: looked for {graph_path}") from None
    graph = _parse_graph(graph_path, text, warnings)
    nodes = [(node, suffix) for node in graph.message.node for suffix in _OPTIONS_OF
             if node.calculator.endswith(suffix)]
    if not nodes:
        calculators = ", ".join(node.calculator for node in graph.message.node) or "none"
        warnings.append(f"{graph_path}: no Http{LLM_CALCULATOR}, {IMAGE_CALCULATOR}, {S2T_CALCULATOR}, "
                        f"{T2S_CALCULATOR}, {EMBEDDINGS_CALCULATOR} or {RERANK_CALCULATOR} node (calculators: "
                        f"{calculators}): ovq does not serve it; {name!r} skipped")
        return None
    if len(nodes) > 1:
        raise graph.error("calculator", f"{len(nodes)} generation nodes in one graph; ovq serves one per graph")
    node, calculator = nodes[0]
    options = _node_options(graph, node, calculator)
    values = _VALUES_OF[calculator](graph, options)
    values.update(name=name, path=_models_dir(graph, base, options))
    if calculator == LLM_CALCULATOR and options.draft_models_path:
        values["draft_models_path"] = _draft_dir(graph, base, options.draft_models_path)
    if calculator == IMAGE_CALCULATOR and options.lora_adapters:
        values["lora_adapters"] = _image_adapters(graph, options, warnings)
    device_option = _DEVICE_OPTION.get(calculator, "device")
    if options.HasField(device_option):
        values["devices"] = [getattr(options, device_option) or "CPU"]
    if options.HasField("plugin_config"):
        values["plugin_config"] = _plugin_config(graph, options.plugin_config)
    _check_directory(graph, calculator, values)
    try:
        return ModelConfig.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "draft_models_path"  # the one model-wide check
        option = {"path": "models_path", "devices": device_option}.get(field, field)
        message = error["msg"].removeprefix("Value error, ")
        raise graph.error(option, message if not error["loc"] else f"{option}: {error['msg']}") from None


def _parse_graph(path: Path, text: str, warnings: list[str]) -> _Graph:
    """Protobuf text format, strictly; each unknown field or options type is blanked out (one warning for a
    field) and the text parsed again, so every such field is reported with its line."""
    source = text
    for _ in range(len(text) + 1):  # each round blanks at least one character
        message = ovms_proto.new(ovms_proto.GRAPH)
        try:
            text_format.Parse(source, message, descriptor_pool=ovms_proto.POOL, allow_unknown_extension=True)
            return _Graph(path, text, message)
        except text_format.ParseError as exc:
            reason = re.sub(r"^\d+:\d+ : ", "", str(exc))
            if unknown := _UNKNOWN_FIELD.search(reason):
                owner, option = unknown.groups()
                warnings.append(f"{path}:{exc.GetLine()}: {_unknown_option(owner, option)}; ignored")
                source = _blank(source, exc.GetLine(), exc.GetColumn())
            elif (unknown := _UNKNOWN_TYPE.search(reason)) and (where := _any_start(source, unknown.group(1))):
                source = _blank(source, *where)  # options of a calculator ovq does not serve: no warning here
            else:
                raise _syntax_error(path, exc, reason) from None
    raise ConfigError(f"{path}: too many unknown fields")


def _syntax_error(path: Path, exc: text_format.ParseError, reason: str) -> ConfigError:
    reason = re.sub(r"^'.*?': ", "", reason)  # the tokenizer quotes the line; the position says where
    where = f":{exc.GetLine()}:{exc.GetColumn()}" if exc.GetLine() else ""
    return ConfigError(f"{path}{where}: {reason}")


def _unknown_option(owner: str, option: str) -> str:
    if option in OVMS_ONLY_OPTIONS:
        return f"{option!r} is an OVMS option ovq does not implement"
    return f"{option!r} is not an option of {owner} that ovq knows"


def _any_start(text: str, type_name: str) -> tuple[int, int] | None:
    """Line and column (1-based) of the `[type.googleapis.com/TYPE]` that opens an Any's expanded value."""
    match = re.search(r"\[\s*[\w.\-]+(\s*/\s*[\w.\-]+)*\s*/\s*" + re.escape(type_name) + r"\s*\]", text)
    if not match:
        return None
    line = text.count("\n", 0, match.start()) + 1
    return line, match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1


def _blank(text: str, line: int, column: int) -> str:
    """`text` with the field starting at (line, column), its value and separator, replaced by spaces."""
    lines = text.split("\n")
    start = sum(len(row) + 1 for row in lines[:line - 1]) + column - 1
    tokenizer = text_format.Tokenizer(text[start:].split("\n"))
    _skip_field(tokenizer)
    if tokenizer.AtEnd():
        end = len(text)
    else:
        here = tokenizer.ParseError("")
        end_line, end_column = line + here.GetLine() - 1, here.GetColumn() + (column - 1 if here.GetLine() == 1 else 0)
        end = sum(len(row) + 1 for row in lines[:end_line - 1]) + end_column - 1
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def _skip_field(tokenizer: text_format.Tokenizer) -> None:
    if tokenizer.TryConsume("["):  # an extension or an Any's type URL
        while not tokenizer.AtEnd() and not tokenizer.TryConsume("]"):
            tokenizer.NextToken()
    else:
        tokenizer.NextToken()
    if tokenizer.TryConsume(":") and not tokenizer.LookingAt("{") and not tokenizer.LookingAt("<"):
        if tokenizer.LookingAt("["):
            _skip_nested(tokenizer)
        else:
            first = tokenizer.token
            tokenizer.NextToken()
            while first[:1] in ("'", '"') and tokenizer.token[:1] in ("'", '"'):  # adjacent strings are one value
                tokenizer.NextToken()
    else:
        _skip_nested(tokenizer)
    if not tokenizer.TryConsume(","):
        tokenizer.TryConsume(";")


def _skip_nested(tokenizer: text_format.Tokenizer) -> None:
    depth = 0
    while not tokenizer.AtEnd():
        depth += tokenizer.token in ("{", "<", "[")
        depth -= tokenizer.token in ("}", ">", "]")
        tokenizer.NextToken()
        if depth <= 0:
            return


def _node_options(graph: _Graph, node: Message, calculator: str) -> Message:
    """OVMS reads the node's first `node_options`; it must be the calculator's own options type."""
    wanted = _OPTIONS_OF[calculator]
    options = ovms_proto.new(wanted)
    if not node.node_options or not node.node_options[0].Unpack(options):
        raise graph.error("node_options", f"node {node.name!r} ({node.calculator}) needs node_options "
                                          f"[type.googleapis.com/{wanted}]")
    if not options.models_path:
        raise graph.error("node_options", f"{wanted}: models_path is required")
    return options


def _models_dir(graph: _Graph, base: Path, options: Message) -> Path:
    directory = Path(os.path.normpath(base / options.models_path))
    if not directory.is_dir():
        raise graph.error("models_path", f"models_path {options.models_path!r}: no model directory at {directory}")
    return directory


def _draft_dir(graph: _Graph, base: Path, draft: str) -> Path:
    """OVMS resolves a relative draft_models_path against the servable's base path, as models_path."""
    directory = Path(os.path.normpath(base / draft))
    if not directory.is_dir():
        raise graph.error("draft_models_path", f"draft_models_path {draft!r}: no model directory at {directory}")
    return directory


def _plugin_config(graph: _Graph, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise graph.error("plugin_config", f"plugin_config is not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise graph.error("plugin_config", "plugin_config must be a JSON object")
    return value


def _set(options: Message, names: tuple[str, ...]) -> dict[str, Any]:
    """The options the graph sets (enums by name; an empty string is unset); the others keep ModelConfig's
    defaults, which are OVMS's, and stay out of `model_fields_set` as they would in a models file."""
    values = {}
    for name in names:
        value = getattr(options, name)
        if options.HasField(name) and value != "":
            enum = options.DESCRIPTOR.fields_by_name[name].enum_type
            values[name] = enum.values_by_number[value].name if enum else value
    return values


def _llm_values(graph: _Graph, options: Message) -> dict[str, Any]:
    values = _set(options, ("max_num_batched_tokens", "cache_size", "max_num_seqs", "dynamic_split_fuse",
                            "best_of_limit", "max_tokens_limit", "enable_prefix_caching", "pipeline_type",
                            "tool_parser", "reasoning_parser", "enable_tool_guided_generation",
                            "draft_device", "draft_max_num_batched_tokens", "draft_cache_size", "draft_block_size",
                            "draft_max_num_seqs", "draft_dynamic_split_fuse"))
    if options.HasField("response_parser"):
        if options.response_parser not in _RESPONSE_PARSERS:
            raise graph.error("response_parser", f"response_parser {options.response_parser!r}: one of "
                                                 f"{', '.join(_RESPONSE_PARSERS)}")
        tool, reasoning = _RESPONSE_PARSERS[options.response_parser]
        values.setdefault("tool_parser", tool)
        if reasoning:
            values.setdefault("reasoning_parser", reasoning)
    if options.HasField("cache_eviction_config"):
        eviction = options.cache_eviction_config
        for required in ("start_size", "recent_size", "max_cache_size"):
            if not eviction.HasField(required):
                raise graph.error("cache_eviction_config", f"cache_eviction_config: {required} is required")
        values["cache_eviction_config"] = _set(eviction, ("aggregation_mode", "start_size", "recent_size",
                                                          "max_cache_size", "apply_rotation"))
    return values


def _image_values(options: Message) -> dict[str, Any]:
    return _set(options, ("max_resolution", "default_resolution", "max_num_images_per_prompt",
                          "default_num_inference_steps", "max_num_inference_steps"))


def _image_adapters(graph: _Graph, options: Message, warnings: list[str]) -> dict[str, dict[str, Any]]:
    """OVMS's `lora_adapters { alias path alpha mode }` as ovq's image LoRA adapters (a relative path is
    relative to the graph's directory). ovq runs every adapter as OVMS's DYNAMIC mode does; STATIC and FUSE are
    loaded that way too, with a warning."""
    adapters: dict[str, dict[str, Any]] = {}
    for entry in options.lora_adapters:
        if not entry.alias or not entry.path:
            raise graph.error("lora_adapters", "lora_adapters: each entry needs an alias and a path")
        if entry.alias in adapters:
            raise graph.error("lora_adapters", f"lora_adapters: alias {entry.alias!r} is given twice")
        path = Path(os.path.normpath(graph.path.parent / entry.path))
        if not path.is_file():
            raise graph.error("lora_adapters", f"lora_adapters: {entry.alias!r}: {path} is not a file")
        mode = entry.DESCRIPTOR.fields_by_name["mode"].enum_type.values_by_number[entry.mode].name
        if entry.HasField("mode") and mode != "DYNAMIC":
            warnings.append(f"{graph.path}:{graph.line_of('lora_adapters')}: lora_adapters {entry.alias!r}: mode "
                            f"{mode} is loaded as DYNAMIC (ovq weighs adapters per request)")
        adapters[entry.alias] = {"path": path, "alpha": entry.alpha if entry.HasField("alpha") else 1.0}
    return adapters


def _speech_values(options: Message, graph_dir: Path) -> dict[str, Any]:
    """S2T's word timestamps; T2S's voices, their relative paths resolved against the graph's directory."""
    fields = options.DESCRIPTOR.fields_by_name
    values = _set(options, ("enable_word_timestamps",)) if "enable_word_timestamps" in fields else {}
    voices = options.voices if "voices" in fields else []
    if voices:
        values["voices"] = [{"name": v.name, "path": Path(os.path.normpath(graph_dir / v.path))} for v in voices]
    return values


def _embeddings_values(graph: _Graph, options: Message) -> dict[str, Any]:
    values = _set(options, ("normalize_embeddings", "truncate"))
    if options.HasField("pooling"):
        pooling = options.DESCRIPTOR.fields_by_name["pooling"].enum_type.values_by_number[options.pooling].name
        values["pooling"] = "LAST" if pooling == "LAST_TOKEN" else pooling
    elif options.HasField("mean_pooling"):  # the older releases' option
        values["pooling"] = "MEAN" if options.mean_pooling else "CLS"
    return values


def _rerank_values(graph: _Graph, options: Message) -> dict[str, Any]:
    return _set(options, ("max_allowed_chunks", "max_position_embeddings"))


_VALUES_OF = {LLM_CALCULATOR: _llm_values, IMAGE_CALCULATOR: lambda graph, options: _image_values(options),
              S2T_CALCULATOR: lambda graph, options: _speech_values(options, graph.path.parent),
              T2S_CALCULATOR: lambda graph, options: _speech_values(options, graph.path.parent),
              EMBEDDINGS_CALCULATOR: _embeddings_values, RERANK_CALCULATOR: _rerank_values}


def _check_directory(graph: _Graph, calculator: str, values: dict[str, Any]) -> None:
    """The calculator decides text, image, speech, embeddings or rerank; as OVMS, an explicit pipeline type must
    match the directory."""
    directory: Path = values["path"]
    if calculator in _SPEECH_TYPES:
        if speech_servable(directory) is not _SPEECH_TYPES[calculator]:
            wanted = "a Whisper model" if calculator == S2T_CALCULATOR else "a SpeechT5 or Kokoro model"
            raise graph.error("models_path", f"{calculator} needs {wanted}: {directory} holds none")
        return
    image = (directory / "model_index.json").exists()
    if calculator in _PIPELINE_OF:
        if image:
            raise graph.error("models_path", f"{directory} holds an image generation model (model_index.json), "
                                             f"not a model for {calculator}")
        values["pipeline_type"] = _PIPELINE_OF[calculator]
        return
    if calculator == IMAGE_CALCULATOR and not image:
        raise graph.error("models_path", f"{IMAGE_CALCULATOR} needs an image generation model: "
                                         f"{directory} has no model_index.json")
    if calculator == LLM_CALCULATOR and image:
        raise graph.error("models_path", f"{directory} holds an image generation model (model_index.json), "
                                         f"not a model for {LLM_CALCULATOR}")
    pipeline = values.get("pipeline_type", "AUTO")
    vision = any((directory / f).exists() for f in VISION_FILES)
    if pipeline != "AUTO" and vision != pipeline.startswith("VLM"):
        kind = "a vision-language" if vision else "a text-only"
        raise graph.error("pipeline_type", f"pipeline_type {pipeline} does not match {directory}: {kind} model")
