"""Compact-JSON grammars: what is translated, and what GenAI generates under them (the tiny random-weight Llama
explores a grammar at random)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from common.structured import json_schema
from workers.engine.compact_json import compact_grammar, literal
from workers.engine.structured import structured_config

TINY = Path(__file__).resolve().parents[3] / "models" / "tiny-llama"
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
TRANSLATED = [
    PERSON,
    {"type": "object"},
    {},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": ["number", "null"]},
                                      "c": {"enum": ["x", 1, None, {"k": "v\""}]}, "d": {"const": "é"}}},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                               "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string", "minLength": 2}]}, "maxItems": 4},
    {"$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                         "next": {"anyOf": [{"$ref": "#/$defs/Node"},
                                                                            {"type": "null"}]}},
                        "required": ["v"]}}, "$ref": "#/$defs/Node"},
    {"title": "Pydantic", "type": "object", "additionalProperties": False, "required": ["city"],
     "properties": {"city": {"title": "City", "type": "string"},
                    "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}}},
]
NOT_TRANSLATED = [
    {"type": "string", "pattern": "^a+$"},
    {"type": "string", "format": "date"},
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
    {"type": "object", "patternProperties": {"^x": {}}},
    {"allOf": [{"type": "object"}]},
    {"$ref": "other.json#/x"},
    {"type": "array", "prefixItems": [{"type": "integer"}]},
]


@pytest.mark.parametrize("schema", NOT_TRANSLATED)
def test_what_is_not_translated_goes_to_xgrammar_as_it_is(schema: dict) -> None:
    assert compact_grammar(schema) is None


def test_literals_escape_for_the_grammar() -> None:
    assert literal({"k": 'a"b\\c'}) == r'"{\"k\":\"a\\\"b\\\\c\"}"'


def compact(text: str) -> bool:
    """No whitespace outside strings."""
    return not re.search(r"\s", STRINGS.sub('""', text))


def generate(pipe: Any, tokenizer: Any, schema: dict, seed: int, prompt: str, max_new: int) -> tuple[str, bool]:
    import numpy as np
    import openvino as ov
    import openvino_genai as g

    config = g.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.temperature, config.rng_seed = max_new, True, 1.0, seed
    config.structured_output_config = structured_config(json_schema(schema))
    ids = tokenizer.encode(prompt, add_special_tokens=False).input_ids.data[0].tolist()
    handle = pipe.add_request(seed, ov.Tensor(np.asarray([ids], dtype=np.int64)), config)
    while pipe.has_non_finished_requests():
        pipe.step()
    output = handle.read_all()[0]
    return tokenizer.decode(list(output.generated_ids)), output.finish_reason == g.GenerationFinishReason.STOP


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    import openvino_genai as g

    scheduler = g.SchedulerConfig()
    scheduler.cache_size = 0
    pipe = g.ContinuousBatchingPipeline(str(TINY), scheduler, "CPU", {})
    return pipe, pipe.get_tokenizer()


@pytest.mark.parametrize("schema", TRANSLATED)
def test_translated_grammars_compile_and_give_valid_compact_json(tiny: tuple[Any, Any], schema: dict) -> None:
    assert compact_grammar(schema) is not None
    finished = 0
    for seed in range(6):
        text, stopped = generate(*tiny, schema, seed, "hello", 48)
        # U+FFFD: the random model picked byte tokens that are no whole UTF-8 character, which xgrammar lets
        # through as characters (its own JSON grammar does the same), so lengths no longer count the same.
        if stopped and "\ufffd" not in text:
            finished += 1
            jsonschema.validate(json.loads(text), schema)
            assert compact(text), text
    assert finished, "no sample finished within the token limit"
