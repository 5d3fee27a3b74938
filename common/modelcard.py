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
    lora_adapters: list[str] = []  # LoRA adapters a request may weigh (`lora_weights`)


class VideoLimits(BaseModel):
    """A video servable's limits (the image node's options where OVMS has one; frames and rate are ovq's)."""

    max_resolution: str
    default_resolution: str | None = None
    default_num_inference_steps: int
    max_num_inference_steps: int
    max_seconds: int
    default_seconds: int
    frame_rate: int
    pipeline: str = ""  # model_index.json's _class_name


class SpeechInfo(BaseModel):
    """A speech servable's abilities: S2T languages and timestamps, T2S voices and output rate."""

    languages: list[str] = []  # Whisper language codes; empty: an English-only model
    word_timestamps: bool = False
    voices: list[str] = []  # named speaker embeddings; without `voice` the model's default speaks
    sample_rate: int = 16_000
    speed: bool = False  # the pipeline honours `speed` (Kokoro); SpeechT5 does not
class EncoderLimits(BaseModel):
    """Embeddings and rerank servables: what a request may ask for."""

    max_length: int  # tokens per input (per query and document pair for rerank)
    truncate: bool = False  # longer inputs are cut to max_length, not refused
    dimensions: int = 0  # the vector's length (embeddings)
    allowed_dimensions: list[int] = []  # smaller lengths a request's `dimensions` may ask for
    max_inputs: int = 2048  # texts per embeddings request, documents per rerank request
    pooling: str = ""
    normalize: bool = True


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
    video: VideoLimits | None = None
    speech: SpeechInfo | None = None
    encoder: EncoderLimits | None = None
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
    # Its engine keeps the KV blocks of recent prompts' prefixes (`enable_prefix_caching`): with OVQ_AFFINITY=auto the
    # API steers a conversation's next turn to the worker that served the last (prefix affinity).
    prefix_caching: bool = False
    # The sampling a request that sets none of these gets (temperature, top_p, presence_penalty, frequency_penalty:
    # the model's generation_config.json over OpenAI's defaults): a Responses object echoes what was used.
    sampling: dict[str, float] = {}
