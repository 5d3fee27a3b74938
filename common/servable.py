"""Servable rules that need no inference runtime: type, chat template, special tokens, limits, defaults."""
from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

# OVMS's template for models without one: exactly one message, its content is the prompt.
DEFAULT_CHAT_TEMPLATE = (
    "{% if messages|length != 1 %} {{ raise_exception('This servable accepts only single message requests') }}"
    "{% endif %}{{ messages[0]['content'] }}"
)
VISION_FILES = ("openvino_vision_embeddings_model.xml", "openvino_vision_encoder.xml")
STATEFUL_DEVICES = ("NPU",)
# diffusers pipeline classes (model_index.json's _class_name) that GenAI's Text2VideoPipeline loads.
VIDEO_PIPELINES = ("LTX",)


class ServableType(str, Enum):
    LM_CB = "LM_CB"
    LM = "LM"
    VLM_CB = "VLM_CB"
    VLM = "VLM"
    IMAGE = "IMAGE"
    VIDEO = "VIDEO"  # Text2VideoPipeline (LTX-Video); OVMS serves no video
    S2T = "S2T"  # speech to text: OVMS's S2tCalculator (WhisperPipeline)
    T2S = "T2S"  # text to speech: OVMS's T2sCalculator (Text2SpeechPipeline)
    EMBEDDINGS = "EMBEDDINGS"  # TextEmbeddingPipeline (OVMS: EmbeddingsCalculatorOV)
    RERANK = "RERANK"  # TextRerankPipeline (OVMS: RerankCalculatorOV)


# Encoders for embeddings are exported without a task head (feature-extraction); cross-encoders with one logit.
RERANK_ARCHITECTURE_SUFFIX = "ForSequenceClassification"
# Causal LMs and the rest carry a head named `...For<Task>`; a bare `BertModel`-style class is an encoder.
_HEADED = "For"


def infer_servable(path: Path, device: str, pipeline_type: str = "AUTO") -> ServableType:
    """Directory says text, vision or image; device says the engine (NPU is stateful); an explicit type wins."""
    if pipeline_type != "AUTO":
        return ServableType(pipeline_type)
    if (path / "model_index.json").exists():
        pipeline = str(_json(path / "model_index.json").get("_class_name", ""))
        return ServableType.VIDEO if pipeline.startswith(VIDEO_PIPELINES) else ServableType.IMAGE
    speech = speech_servable(path)
    if speech is not None:
        return speech
    encoder = encoder_servable(path)
    if encoder is not None:
        return encoder
    vision = any((path / f).exists() for f in VISION_FILES)
    stateful = device.split(":")[0].upper() in STATEFUL_DEVICES
    if vision:
        return ServableType.VLM if stateful else ServableType.VLM_CB
    return ServableType.LM if stateful else ServableType.LM_CB


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def chat_template(path: Path, tokenizer_template: str = "", configured: Path | None = None) -> str:
    """First found: the models file's `chat_template` file, the directory's chat_template.jinja, template.jinja,
    tokenizer_config.json, the tokenizer's, OVMS default."""
    if configured is not None:
        return configured.read_text()
    for name in ("chat_template.jinja", "template.jinja"):
        if (path / name).exists():
            return (path / name).read_text()
    template = _json(path / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):  # HF allows named templates; "default" is the chat one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template or tokenizer_template or DEFAULT_CHAT_TEMPLATE


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # AddedToken serialised by transformers
        return str(value.get("content", ""))
    return str(value or "")


def special_tokens(path: Path, fallback_bos: str = "", fallback_eos: str = "") -> tuple[str, str]:
    config = _json(path / "tokenizer_config.json")
    if config:
        return _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    return fallback_bos, fallback_eos


def context_length(path: Path, default: int = 2048) -> int:
    config = _json(path / "config.json")
    for section in (config, config.get("text_config", {}), config.get("llm_config", {})):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(section.get(key), int):
                return int(section[key])
    return default


def vocab_size(path: Path) -> int | None:
    config = _json(path / "config.json")
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    return int(size) if size else None


def eos_ids(path: Path) -> list[int]:
    value = _json(path / "generation_config.json").get("eos_token_id")
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


GENERATION_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def generation_defaults(path: Path) -> dict[str, Any]:
    """The model's `generation_config.json`, as request field names (sampling off means temperature 0)."""
    config = _json(path / "generation_config.json")
    defaults = {ours: config[theirs] for theirs, ours in GENERATION_FIELDS.items() if theirs in config}
    if config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return defaults


# config.json model_type of the speech models GenAI's pipelines load.
SPEECH_TO_TEXT_MODELS = ("whisper",)
TEXT_TO_SPEECH_MODELS = ("speecht5", "kokoro")


def speech_servable(path: Path) -> ServableType | None:
    """S2T for a Whisper directory, T2S for SpeechT5 (its vocoder) or Kokoro; None for anything else."""
    model_type = str(_json(path / "config.json").get("model_type", "")).lower()
    if model_type in SPEECH_TO_TEXT_MODELS:
        return ServableType.S2T
    if model_type in TEXT_TO_SPEECH_MODELS or (path / "openvino_vocoder.xml").exists():
        return ServableType.T2S
    return None


def whisper_languages(path: Path) -> list[str]:
    """The language codes a Whisper model knows (`en`, from generation_config.json's `<|en|>`), in its order."""
    languages = _json(path / "generation_config.json").get("lang_to_id") or {}
    return [str(token).strip("<|>") for token in languages]


def whisper_multilingual(path: Path) -> bool:
    return bool(_json(path / "generation_config.json").get("is_multilingual", False))
def encoder_servable(path: Path) -> ServableType | None:
    """A directory exported for embeddings (a bare encoder class) or rerank (a sequence classifier), by its
    config.json's `architectures`; None for anything else (an explicit `pipeline_type` covers decoder-based ones)."""
    architectures = _json(path / "config.json").get("architectures") or []
    if not architectures or not isinstance(architectures[0], str):
        return None
    if architectures[0].endswith(RERANK_ARCHITECTURE_SUFFIX):
        return ServableType.RERANK
    if _HEADED not in architectures[0] and architectures[0].endswith("Model"):
        return ServableType.EMBEDDINGS
    return None


POOLING_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN",
                 "pooling_mode_lasttoken": "LAST"}


def default_pooling(path: Path) -> str:
    """The pooling a sentence-transformers export declares (`1_Pooling/config.json`), as OVMS detects it; CLS when
    none does (GenAI's default)."""
    config = _json(path / "1_Pooling" / "config.json")
    return next((mode for key, mode in POOLING_MODES.items() if config.get(key)), "CLS")
