"""What a worker announces about its model: all the API needs to validate requests and render prompts."""
from __future__ import annotations

from pydantic import BaseModel

from common.servable import ServableType


class ModelCard(BaseModel):
    v: int = 1
    name: str
    device: str
    servable_type: ServableType
    context_length: int
    max_tokens_limit: int | None = None
    best_of_limit: int = 20
    chat_template: str
    bos_token: str = ""
    eos_token: str = ""
    capabilities: list[str] = []
    # Position of this device in the model's `devices` list: breaks ties between equally busy devices.
    preference: int = 0
    created: int
