"""OVMS's `/tokenize`: a text (or several) as the token ids of a model's own tokenizer.

The API tokenizes itself, with the OpenVINO tokenizer of the model directory the models file names (loaded once
per model and API process), rather than sending a job through the queue: it is a lookup, not generation, and a
tokenizer costs a few MB. So the API host needs the model directory, as it needs the models file; where it has
not got it, the answer is a 503 saying so.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from api.openai.serving import parse_body
from common.errors import OvqError, not_found, unavailable
from common.models.sources import find_model
from common.settings import Settings, get_settings

router = APIRouter()


class TokenizeRequest(BaseModel):
    """OVMS's fields and defaults."""

    model_config = ConfigDict(extra="forbid")

    model: str
    text: str | list[str]
    add_special_tokens: bool = True
    max_length: int | None = Field(None, ge=1)
    pad_to_max_length: bool = False
    padding_side: Literal["left", "right"] = "right"


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[list[int]]


class Tokenizers:
    """Each model's tokenizer, loaded on first use; encoding runs off the event loop, one call at a time each."""

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[Any, threading.Lock]] = {}
        self._guard = threading.Lock()

    def encode(self, settings: Settings, body: TokenizeRequest) -> list[list[int]]:
        tokenizer, lock = self._tokenizer(settings, body.model)
        texts = [body.text] if isinstance(body.text, str) else body.text
        with lock:
            encoded = [tokenizer.encode(text, add_special_tokens=body.add_special_tokens).input_ids.data[0].tolist()
                       for text in texts]
        return [shaped(ids, body, tokenizer.get_pad_token_id()) for ids in encoded]

    def count(self, settings: Settings, model: str, text: str, add_special_tokens: bool = False) -> int:
        """How many tokens `text` is to `model` (a chat prompt already holds its special tokens, as the worker
        tokenizes it: none added)."""
        tokenizer, lock = self._tokenizer(settings, model)
        with lock:
            return int(tokenizer.encode(text, add_special_tokens=add_special_tokens).input_ids.data.shape[1])

    def _tokenizer(self, settings: Settings, model: str) -> tuple[Any, threading.Lock]:
        with self._guard:
            if model not in self._loaded:
                self._loaded[model] = (_load(settings, model), threading.Lock())
            return self._loaded[model]


def _load(settings: Settings, model: str) -> Any:
    import openvino_genai

    try:
        path = find_model(settings, model).path
    except KeyError:
        raise not_found(f"The model `{model}` does not exist") from None
    if (path / "model_index.json").exists():
        raise OvqError(f"`{model}` is an image generation model: /tokenize serves text models", param="model")
    if not (path / "openvino_tokenizer.xml").exists():
        raise unavailable(f"the tokenizer of `{model}` is not on this API host (looked in {path})")
    return openvino_genai.Tokenizer(str(path), INFERENCE_NUM_THREADS=1)


def shaped(ids: list[int], body: TokenizeRequest, pad: int) -> list[int]:
    """Cut to max_length; padded to it (on padding_side) when asked."""
    if body.max_length is None:
        return ids
    ids = ids[: body.max_length]
    if body.pad_to_max_length:
        padding = [max(pad, 0)] * (body.max_length - len(ids))
        ids = padding + ids if body.padding_side == "left" else ids + padding
    return ids


TOKENIZERS = Tokenizers()


@router.post("/tokenize")
async def tokenize(request: Request) -> TokenizeResponse:
    body = await parse_body(request, TokenizeRequest)
    if await request.app.state.registry.served(body.model) is None:
        raise not_found(f"The model `{body.model}` does not exist")
    settings = getattr(request.app.state, "settings", None) or get_settings()
    encoded = await asyncio.to_thread(TOKENIZERS.encode, settings, body)
    return TokenizeResponse(tokens=encoded[0] if isinstance(body.text, str) else encoded)
