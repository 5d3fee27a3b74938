"""schemathesis over every public route, bodies generated from the request models (`api/openai/protocol.py`, served in
/openapi.json), aimed at the real models (the vision one included) with small budgets: no answer may be a 5xx."""
from __future__ import annotations

import base64
import copy
import io
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from PIL import Image

from tests.conftest import IMAGE, MODEL, STATEFUL, TOOLS, VLM, Stack
from tests.integration.counts import Tally

# Examples per operation: a few hundred requests in all, bounded to well under a minute on two cores.
BUDGET = {"/v3/chat/completions": 110, "/v3/completions": 50, "/v3/images/generations": 25,
          "/v3/images/edits": 15, "/v3/models": 3, "/v3/models/{model}": 8, "/health": 2, "/v2/health/live": 2,
          "/v2/health/ready": 2, "/v2/models/{model}/ready": 8, "/v3/responses": 40, "/v3/responses/{response_id}": 4,
          "/v3/responses/{response_id}/input_items": 4}
NARROW_BUDGET = {"/v3/chat/completions": 70, "/v3/completions": 30, "/v3/responses": 40}


def _png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _tighten(node: Any, stack: Stack) -> None:
    """Real model names and small budgets, so generated requests reach the workers and finish quickly."""
    if isinstance(node, list):
        for item in node:
            _tighten(item, stack)
        return
    if not isinstance(node, dict):
        return
    properties = node.get("properties", {})
    small = {"type": "integer", "minimum": 0, "maximum": 4}
    replacements = {
        "model": {"enum": [MODEL, VLM, VLM, IMAGE, STATEFUL, TOOLS, "no-such-model"]},
        "max_tokens": small, "max_completion_tokens": small, "min_tokens": small, "n": small, "best_of": small,
        "num_inference_steps": {"type": "integer", "minimum": -1, "maximum": 3},
        "size": {"enum": ["32x32", "64x32", "1x1", "3x3", "auto", "99999x99999", "x", "0x0"]},
        "partial_images": small, "url": {"anyOf": [{"enum": [
            _png(), f"http://localhost:{stack.media_port}/gone.png", "cat.png", "file:///etc/passwd"]},
            {"type": "string", "maxLength": 40}]},
    }
    for name, replacement in replacements.items():
        if name in properties:
            properties[name] = replacement
    if "max_output_tokens" in properties:  # /responses: at least 16
        properties["max_output_tokens"] = {"type": "integer", "minimum": 15, "maximum": 18}
    for name in ("max_tokens", "max_output_tokens"):  # unset, it is the model's default (512): too long for a test
        if name in properties:
            node["required"] = sorted({*node.get("required", []), name})
    for value in node.values():
        _tighten(value, stack)


def _path_parameters(raw: dict[str, Any]) -> None:
    for item in raw["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "model":
                    parameter["schema"] = {"anyOf": [{"enum": [MODEL, VLM, IMAGE, "nope", "a/b"]},
                                                     {"type": "string", "minLength": 1, "maxLength": 12}]}


def _narrow(raw: dict[str, Any]) -> dict[str, Any]:
    """Mostly valid text requests (few fields, in range), so that many reach a worker, the vision one included."""
    raw = copy.deepcopy(raw)
    schemas = raw["components"]["schemas"]
    schemas["ChatMessage"] = {"type": "object", "additionalProperties": False, "required": ["role", "content"],
                              "properties": {"role": {"enum": ["user", "system", "assistant"]}, "content": {
                                  "anyOf": [{"type": "string", "maxLength": 30},
                                            {"type": "array", "maxItems": 3,
                                             "items": {"$ref": "#/components/schemas/ContentPart"}}]}}}
    schemas["ContentPart"] = {"type": "object", "additionalProperties": False, "required": ["type"],
                              "properties": {"type": {"enum": ["text", "image_url"]},
                                             "text": {"type": "string", "maxLength": 30},
                                             "image_url": {"$ref": "#/components/schemas/ImageURL"}}}
    common = {"model": {"enum": [MODEL, VLM, STATEFUL, TOOLS]}, "max_tokens": {"type": "integer", "minimum": 1,
                                                                               "maximum": 4},
              "stream": {"type": "boolean"}, "temperature": {"type": "number", "minimum": 0, "maximum": 2},
              "seed": {"type": "integer", "minimum": 0, "maximum": 1000},
              "stop": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 4}}}
    bodies = {"/v3/chat/completions": {"messages": {"type": "array", "minItems": 1, "maxItems": 3,
                                                    "items": {"$ref": "#/components/schemas/ChatMessage"}},
                                       "logprobs": {"type": "boolean"}},
              "/v3/completions": {"prompt": {"type": "string", "minLength": 1, "maxLength": 40},
                                  "echo": {"type": "boolean"}, "logprobs": {"enum": [0, 1]}}}
    for path, extra in bodies.items():
        body = raw["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        body["schema"] = {"type": "object", "additionalProperties": False, "properties": {**common, **extra},
                          "required": ["model", "max_tokens", *(k for k in extra if k in ("messages", "prompt"))]}
    message = {"type": "object", "additionalProperties": False, "required": ["role", "content"],
               "properties": {"role": {"enum": ["user", "assistant", "system", "developer"]},
                              "content": {"type": "string", "maxLength": 20}}}
    responses = {**{k: v for k, v in common.items() if k != "max_tokens"}, "store": {"type": "boolean"},
                 "max_output_tokens": {"type": "integer", "minimum": 16, "maximum": 18},
                 "instructions": {"type": "string", "maxLength": 20},
                 "input": {"anyOf": [{"type": "string", "maxLength": 30},
                                     {"type": "array", "maxItems": 3, "items": message}]},
                 "include": {"type": "array", "items": {"enum": ["message.output_text.logprobs"]}}}
    body = raw["paths"]["/v3/responses"]["post"]["requestBody"]["content"]["application/json"]
    body["schema"] = {"type": "object", "additionalProperties": False, "properties": responses,
                      "required": ["model", "max_output_tokens", "input"]}
    return raw


def test_fuzzing_every_public_route_gives_no_5xx(stack: Stack) -> None:
    raw = httpx.get(stack.url("/openapi.json"), timeout=30).json()
    _tighten(raw, stack)
    _path_parameters(raw)
    tally, statuses = Tally(), {}
    passes = [(schemathesis.openapi.from_dict(raw), BUDGET),
              (schemathesis.openapi.from_dict(_narrow(raw)), NARROW_BUDGET)]
    for schema, budgets in passes:
        _fuzz(stack, schema, budgets, tally, statuses)
    print("\n".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    print(tally)
    assert tally.accepted >= 300, tally
    assert statuses.get(f"POST /v3/chat/completions 200 {VLM}"), statuses  # the vision model answered
    tally.check()


def _fuzz(stack: Stack, schema: Any, budgets: dict[str, int], tally: Tally, statuses: dict[str, int]) -> None:
    for result in schema.get_all_operations():
        operation = result.ok()
        budget = budgets.get(operation.path, 0)
        if not budget:
            continue  # the /v1 aliases route to the same handlers

        @settings(max_examples=budget, deadline=None, phases=[Phase.generate], database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            try:
                response = case.call(base_url=stack.url(""), timeout=30)
            except requests.RequestException as exc:  # no answer in time, or the connection dropped
                print("no answer:", repr(exc)[:200], case.as_curl_command()[:500])
                tally.record(None)
                return
            except pytest.fail.Exception:
                return  # schemathesis could not serialize the case (lone surrogates): nothing was sent
            if response.status_code >= 500:
                print("5xx:", response.text[:300], case.as_curl_command()[:500])
            tally.record(response)
            key = f"{case.method} {case.path} {response.status_code}"
            if case.method == "POST" and isinstance(case.body, dict):
                key += " " + str(case.body.get("model"))
            statuses[key] = statuses.get(key, 0) + 1

        run()
