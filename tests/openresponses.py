"""The Open Responses specification's schemas (tests/specs/openresponses/openapi.json), as validators.

`response(obj)`, `item(obj)` and `event(obj)` raise `jsonschema.ValidationError` for an object that the spec's
`ResponseResource`, `ItemField` or streaming event of the object's `type` does not accept. The spec declares each
streaming event's `type` as a one-value enum: that value picks the event's schema (its `discriminator`).

Two divergences are allowed, and only these (docs/reference/api/responses.md says why), both where OpenAI's API and
SDK read otherwise than the spec: the spec types the echoed `text.format.schema` of a `json_schema` format as
`null` (ovq echoes the schema), and names reasoning text's events `response.reasoning.delta` and `.done` (ovq sends
OpenAI's `response.reasoning_text.delta` and `.done`, checked here against the spec's schemas of those events).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = Path(__file__).parent / "specs" / "openresponses" / "openapi.json"
URI = "urn:openresponses:openapi"
RENAMED = {"response.reasoning_text.delta": "response.reasoning.delta",
           "response.reasoning_text.done": "response.reasoning.done"}  # OpenAI's event name: the spec's


@functools.cache
def _document() -> dict[str, Any]:
    return json.loads(SPEC.read_text())


@functools.cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    # OpenAPI 3.1's schemas are JSON Schema 2020-12; the document itself names no `$schema`.
    registry: Registry = Registry().with_resource(URI, Resource.from_contents(_document(), DRAFT202012))
    schema = {"$ref": f"{URI}#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def event_schemas() -> dict[str, str]:
    """Each streaming event's `type` and the name of its schema."""
    schemas = _document()["components"]["schemas"]
    names = {}
    for name, schema in schemas.items():
        if name.endswith("StreamingEvent"):
            names[schema["properties"]["type"]["enum"][0]] = name
    return names


def validate(obj: Any, name: str) -> None:
    """`obj` as the spec's schema `name` takes it; a problem raises, naming every leaf error with its path (a
    oneOf's message alone says only that no branch matched)."""
    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(obj))
    if error is not None:
        leaves = [f"{leaf.json_path}: {leaf.message[:200]}" for leaf in _leaves(error)]
        raise jsonschema.ValidationError(f"{name}: " + "; ".join(leaves[:8]), instance=obj)


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    if not error.context:
        return [error]
    return [leaf for sub in error.context for leaf in _leaves(sub)]


def response(obj: Any) -> None:
    validate(_echoed_schema_as_null(obj), "ResponseResource")


def item(obj: Any) -> None:
    validate(obj, "ItemField")


def event(obj: dict[str, Any]) -> None:
    kind = obj.get("type")
    if kind in RENAMED:
        kind = RENAMED[kind]
        obj = {**obj, "type": kind}
    if kind not in event_schemas():
        raise jsonschema.ValidationError(f"{kind!r} is not a streaming event of the spec")
    if isinstance(obj.get("response"), dict):
        obj = {**obj, "response": _echoed_schema_as_null(obj["response"])}
    validate(obj, event_schemas()[kind])


def _echoed_schema_as_null(response: Any) -> Any:
    """The one allowed divergence (see above): a `json_schema` format's echoed schema read as the spec's null."""
    fmt = response.get("text", {}).get("format") if isinstance(response, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        return response
    return {**response, "text": {**response["text"], "format": {**fmt, "schema": None}}}
