"""What a worker announces about its model: all the API needs to validate requests and render prompts."""
from __future__ import annotations

from pydantic import BaseModel

from common.servable import ServableType


class ImageLimits(BaseModel):
    max_resolution: str
    default_resolution: str | None = None
    max_num_images_per_prompt: int
    default_num_inference_steps: int
    max_num_inference_steps: int
    pipeline: str = ""  # model_index.json's _class_name
    edits: bool = True


class ModelCard(BaseModel):
    v: int = 1
    name: str
    device: str
    servable_type: ServableType
    context_length: int = 0
    vocab_size: int | None = None  # token ids a request names (stop_token_ids) must be below it
    max_tokens_limit: int | None = None
    best_of_limit: int = 20
    chat_template: str = ""
    image: ImageLimits | None = None
    bos_token: str = ""
    eos_token: str = ""
    capabilities: list[str] = []
    # Output parsing and guidance (OVMS node options), and prompt lookup decoding (plugin_config).
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    enable_tool_guided_generation: bool = False
    prompt_lookup: bool = False
    speculative: bool = False  # served with a draft model (draft_models_path)
    adapters: list[str] = []  # LoRA adapters requests may select ("MODEL:NAME" or "NAME")
    # Position of this device in the model's `devices` list: breaks ties between equally busy devices.
    preference: int = 0
    created: int
