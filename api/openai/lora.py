"""vLLM's runtime LoRA endpoints: `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (admin keys only,
`api/http/auth.py`).

Loading records the adapter in its model's Redis hash (`Keys.lora`); every text worker of that model reads the hash
and rebuilds its engine with it, one worker at a time (`workers/text/adapters.py`). From then on a request names
it as `MODEL:NAME` or `NAME`, and `/v1/models` lists it; unloading removes it from the hash, so new requests for it
are a 404 while the workers rebuild without it. The answers are vLLM's: plain-text success, 400 for a name loaded
already, 404 for one that is not.

vLLM serves one model; ovq serves several, so the body may say which (`model`, ovq's field); without it the one
continuous-batching text model, if there is exactly one. The file must be readable where the API runs, as the
models file's paths are (a peft directory, or its `adapter_model.safetensors`); the workers read it too.
"""
from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from api.openai.serving import parse_body
from common.errors import OvqError, not_found
from common.servable import ServableType

router = APIRouter()
PATHS = ("/load_lora_adapter", "/unload_lora_adapter")
# The servables whose engine switches adapters (the continuous-batching text engine).
ADAPTABLE = (ServableType.LM_CB,)


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str
    model: str | None = None  # ovq: which base model (vLLM serves one)
    alpha: float = 1.0  # ovq: the adapter's weight, as a models file's lora_adapters give it
    load_inplace: bool = False  # vLLM's: replace an adapter of that name (ovq: unload, then load)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's, unused
    model: str | None = None


def adapter_file(given: str) -> Path:
    """The safetensors file a `lora_path` names: the file, or `adapter_model.safetensors` in a peft directory."""
    path = Path(given).expanduser()
    if path.is_dir():
        path = path / "adapter_model.safetensors"
    if not path.is_file() or path.suffix != ".safetensors":
        raise OvqError(f"lora_path: {given!r} is not a safetensors file (or a directory holding "
                       "adapter_model.safetensors) readable here", param="lora_path")
    return path.resolve()


async def base_model(request: Request, given: str | None) -> str:
    """The model the adapter is for: named, or the only continuous-batching text model served."""
    registry = request.app.state.registry
    models = await registry.models()
    if given is not None:
        card = models.get(given, False)
        if card is False:
            raise not_found(f"The model `{given}` does not exist")
        if card is not None and card.servable_type not in ADAPTABLE:
            raise OvqError(f"`{given}` is a {card.servable_type.value} servable: LoRA adapters load onto "
                           "continuous-batching text models", param="model")
        return given
    adaptable = [name for name, card in models.items() if card is not None and card.servable_type in ADAPTABLE]
    if len(adaptable) != 1:
        raise OvqError("name the base model in `model`: "
                       + (f"several are served ({', '.join(adaptable)})" if adaptable else "none is served now"),
                       param="model")
    return adaptable[0]


def _check_name(name: str) -> None:
    if not name or ":" in name or name != name.strip():
        raise OvqError("lora_name: not empty, without ':' or surrounding spaces", param="lora_name")


@router.post(PATHS[0])
async def load(request: Request) -> PlainTextResponse:
    body = await parse_body(request, LoadLoraAdapterRequest)
    _check_name(body.lora_name)
    model = await base_model(request, body.model)
    path = adapter_file(body.lora_path)
    registry, settings = request.app.state.registry, request.app.state.settings
    models = await registry.models()
    static = {a for card in models.values() if card is not None for a in card.adapters}
    if body.lora_name in models or body.lora_name in static:
        raise OvqError(f"The lora adapter '{body.lora_name}' has already been loaded.", param="lora_name")
    loaded = await registry.runtime_adapters(model, fresh=True)
    if body.lora_name in loaded and not body.load_inplace:
        raise OvqError(f"The lora adapter '{body.lora_name}' has already been loaded.", param="lora_name")
    if body.lora_name not in loaded and len(loaded) >= settings.max_lora_adapters:
        raise OvqError(f"`{model}` has {len(loaded)} LoRA adapters loaded, the most allowed "
                       "(OVQ_MAX_LORA_ADAPTERS): unload one first", param="lora_name")
    record = json.dumps({"path": str(path), "alpha": body.alpha})
    await registry.redis.hset(registry.keys.lora(model), body.lora_name, record)
    registry.forget_adapters(model)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post(PATHS[1])
async def unload(request: Request) -> PlainTextResponse:
    body = await parse_body(request, UnloadLoraAdapterRequest)
    registry = request.app.state.registry
    models = [body.model] if body.model is not None else list(await registry.models())
    for model in models:
        if await registry.redis.hdel(registry.keys.lora(model), body.lora_name):
            registry.forget_adapters(model)
            return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
    raise OvqError(f"The lora adapter '{body.lora_name}' cannot be found.", 404, "invalid_request_error",
                   "lora_name", "lora_not_found")
