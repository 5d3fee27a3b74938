"""The grammar of what may follow a structured job's written text: built by derivatives, compiled by GenAI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import validate

from common import structured
from tests.precision import F32
from workers.engine.continuous import Engine
from workers.engine.ebnf import parse
from workers.engine.protocol import EngineSpec
from workers.engine.residual import continuable, grammar_of, residual

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                           "city": {"type": "string", "maxLength": 12}},
          "required": ["name", "age", "city"]}
PROMPT = ("<|im_start|>user\nDescribe a person as JSON with a name, an age and a city.<|im_end|>\n"
          "<|im_start|>assistant\n")


def matched(tree: structured.Node, text: str) -> bool:
    """Whether `text` is a whole word of `tree`'s language, by the derivatives alone."""
    grammar = grammar_of(tree)
    assert grammar is not None
    return grammar.derive(text) and grammar.complete()


def test_a_json_schemas_words_are_its_compact_instances_and_nothing_else() -> None:
    tree = structured.json_schema(PERSON)
    assert matched(tree, '{"name":"Al\\"i\\u00e9","age":-42,"city":"Nice"}')
    for wrong in ('{"name":"Al","age":42}', '{"name":"Al","age":042,"city":""}', '{"name": "Al","age":4,"city":""}',
                  '{"name":"Al","age":4,"city":""}}', '{"name":"a long name, too long","age":1,"city":""}'):
        assert not matched(tree, wrong), wrong


def test_the_residual_takes_exactly_the_rest_of_the_words_that_begin_with_the_prefix() -> None:
    tree = structured.json_schema(PERSON)
    whole = '{"name":"Ann","age":7,"city":"Rome"}'
    for cut in range(len(whole) + 1):
        rest = residual(tree, whole[:cut])
        assert rest is not None
        after = {"ebnf": rest}
        assert matched(after, whole[cut:]), cut
        assert not matched(after, whole[cut:] + "}") and (cut == 0 or not matched(after, whole))
    assert residual(tree, '{"age"') is None  # no word begins so


def test_free_text_in_a_tag_runs_to_its_end_tag_and_never_contains_it() -> None:
    tree = structured.concat(structured.tag("", structured.any_text(), "</think>"), structured.const("ok"))
    assert matched(tree, "a </thin> <<//think> b</think>ok")
    assert not matched(tree, "a </think> b</think>ok") and not matched(tree, "a ok")
    assert matched({"ebnf": residual(tree, "x </thi")}, "nk>ok")


def test_forced_tool_calls_are_tags_with_a_separator() -> None:
    call = structured.tag('<tool_call>{"name": "f", "arguments": ', structured.json_schema(PERSON), "}</tool_call>")
    one = structured.tags_with_separator([call], "\n", at_least_one=True, stop_after_first=True)
    many = structured.tags_with_separator([call], "\n", at_least_one=True, stop_after_first=False)
    text = '<tool_call>{"name": "f", "arguments": {"name":"A","age":1,"city":"B"}}</tool_call>'
    assert matched(one, text) and not matched(one, text + "\n" + text) and not matched(one, "")
    assert matched(many, text + "\n" + text)
    assert matched({"ebnf": residual(many, text + "\n<tool")}, text[5:])


def test_what_is_not_taken_apart_is_not_continuable() -> None:
    assert continuable(structured.json_schema(PERSON)) and continuable(structured.json_schema({"type": "object"}))
    for tree in (structured.json_schema({"type": "string", "pattern": "^a+$"}), structured.regex("a+"),
                 structured.triggered_tags(["<tool_call>"], [structured.tag("<tool_call>", structured.const("x"),
                                                                                 "</tool_call>")]),
                 structured.any_text(), {"ebnf": 'root ::= TagDispatch(("<a>", b))\nb ::= "x"'}):
        assert not continuable(tree), tree
        assert residual(tree, "") is None


def test_a_residual_reads_back_as_the_grammar_it_is() -> None:
    rest = residual(structured.json_schema(PERSON), '{"name":"Jo')
    assert rest is not None and parse(rest)["root"]


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, F32, 8192))


def run(engine: Engine, name: str, params: dict, resume: dict | None = None) -> list[int]:
    out: list[list] = []
    engine.add(name, PROMPT, False, params, [], resume, out)
    while name in engine.requests:
        engine.step(out)
    assert not any(u[2] == "error" for u in out), out
    return [i for u in out if u[2] != "accepted" for i in u[1]]


CALL_BEGIN = '<tool_call>{"name": "person", "arguments": '
FORCED_CALL = structured.tags_with_separator(
    [structured.tag(CALL_BEGIN, structured.json_schema(PERSON), "}</tool_call>")], "\n", at_least_one=True,
    stop_after_first=True)


def instance(tree: structured.Node, text: str) -> object:
    """The JSON instance of PERSON that `text` holds (the whole answer, or a forced call's arguments)."""
    if tree is FORCED_CALL:
        assert text.startswith(CALL_BEGIN) and text.endswith("}</tool_call>"), text
        text = text[len(CALL_BEGIN):-len("}</tool_call>")]
    return json.loads(text)


@pytest.mark.parametrize("tree", [structured.json_schema(PERSON), FORCED_CALL], ids=["json_schema", "forced_call"])
def test_a_structured_job_resumed_mid_answer_ends_valid_from_its_written_prefix(engine: Engine, tree) -> None:
    """SmolLM2 writes a person (as the answer, or as a forced tool call's arguments); resumed from a cut anywhere
    in it (a takeover: prompt + those ids prefilled, the matcher new), the answer goes on under the residual
    grammar: the prefix plus what follows is one valid instance. Under the job's own grammar the new matcher
    would start over after the prefix."""
    params = {"structured": tree, "max_tokens": 80, "temperature": 0}
    ids = run(engine, "whole", params)
    validate(instance(tree, engine.tokenizer.decode(ids)), PERSON)
    for cut in (1, len(ids) // 3, len(ids) // 2, len(ids) - 2):
        rest = run(engine, f"cut{cut}", params, {"generated": {"0": ids[:cut]}, "done": []})
        prefix = engine.tokenizer.decode(ids[:cut])
        text = engine.tokenizer.decode(ids[:cut] + rest)
        assert text.startswith(prefix) and matched(tree, text), (prefix, text)
        validate(instance(tree, text), PERSON)


def test_a_structured_job_cut_inside_a_character_ends_with_an_error_not_a_guess(engine: Engine) -> None:
    """The grammar is followed in characters; xgrammar follows bytes. A cut inside a character's bytes has no
    character-level residual, so the resumed job is refused (the client gets one clean error). GenAI's decode
    drops the incomplete character without a trace, so the cut is found by what follows it."""
    ids = engine.tokenize('{"name":"東京', False)
    split = next(n for n in range(1, len(ids)) if engine.tokenizer.decode(ids[:n + 1]).endswith("東")
                 and not engine.tokenizer.decode(ids[:n]).endswith("東"))
    assert "\ufffd" not in engine.tokenizer.decode(ids[:split])  # nothing in the text says it was cut
    out: list[list] = []
    params = {"structured": structured.json_schema(PERSON), "max_tokens": 20, "temperature": 0}
    engine.add("split", PROMPT, False, params, [], {"generated": {"0": ids[:split]}, "done": []}, out)
    assert [u[2] for u in out] == ["error"] and "cannot be continued" in str(out[0]), out
    assert "split" not in engine.requests
