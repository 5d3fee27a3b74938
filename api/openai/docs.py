"""/docs and /openapi.json, served with no CDN: Swagger UI's files come from the `swagger-ui-bundle-v2` wheel.

The routes read their bodies themselves (no FastAPI body parameters, so validation errors stay OpenAI's), so
the schema gets each request body from `api/openai/protocol.py` (`/responses`: `api/openai/responses/protocol.py`)
here, and the Bearer scheme the API keys use.
Both routes are operator routes: see `api/http/auth.py` for who may open them.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from api.openai.audio_protocol import SpeechRequest, TranscriptionRequest, TranslationRequest
from api.openai.encoder_protocol import EmbeddingRequest, RerankRequest
from api.openai.protocol import ChatCompletionRequest, CompletionRequest, ImageEditRequest, ImageRequest
from api.openai.responses.protocol import ResponsesRequest

ASSETS = "/docs/assets"
JSON_BODIES: dict[str, type[BaseModel]] = {
    "/chat/completions": ChatCompletionRequest,
    "/completions": CompletionRequest,
    "/responses": ResponsesRequest,
    "/images/generations": ImageRequest,
    "/audio/speech": SpeechRequest,
    "/embeddings": EmbeddingRequest,
    "/rerank": RerankRequest,
}
AUDIO_FORMS: dict[str, type[BaseModel]] = {"/audio/transcriptions": TranscriptionRequest,
                                           "/audio/translations": TranslationRequest}


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
    components.update(schema.pop("$defs", {}))
    return schema


def _edit_form(components: dict[str, Any]) -> dict[str, Any]:
    schema = _schema(ImageEditRequest, components)
    schema["properties"].update(image={"type": "string", "format": "binary"},
                                mask={"type": "string", "format": "binary"})
    schema["required"] = [*schema.get("required", []), "image"]
    return schema


def _audio_form(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = _schema(model, components)
    schema["properties"]["file"] = {"type": "string", "format": "binary"}
    schema["required"] = [*schema.get("required", []), "file"]
    return schema


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {})
    models = components.setdefault("schemas", {})
    for path, item in schema["paths"].items():
        post = item.get("post")
        if post is None:
            continue
        suffix = path[3:]  # after /v1 or /v3
        if suffix in JSON_BODIES:
            content = {"application/json": {"schema": _schema(JSON_BODIES[suffix], models)}}
        elif suffix == "/images/edits":
            content = {"multipart/form-data": {"schema": _edit_form(models)}}
        elif suffix in AUDIO_FORMS:
            content = {"multipart/form-data": {"schema": _audio_form(AUDIO_FORMS[suffix], models)}}
        else:
            continue
        post["requestBody"] = {"required": True, "content": content}
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    schema["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema


def install_docs(app: FastAPI) -> None:
    """For an app made with docs_url=None and redoc_url=None (FastAPI's pages load Swagger UI from a CDN)."""
    import swagger_ui_bundle

    app.openapi = lambda: openapi_schema(app)  # type: ignore[method-assign]
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
