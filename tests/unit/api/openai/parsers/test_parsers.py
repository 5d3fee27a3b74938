"""Output parsers: every case is parsed whole and streamed split at every position and char by char, and the
streamed answer must be exactly the whole one."""
from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from api.openai.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    Function,
    Hermes3ToolParser,
    Llama3ToolParser,
    MistralToolParser,
    OutputParser,
    ParsedDelta,
    Qwen3ReasoningParser,
    ToolCallDelta,
    output_parser,
)
from api.openai.parsers.jsonscan import NOT_JSON, JsonScanner
from common.structured import json_schema

Call = tuple[str, str]  # (name, arguments)
Answer = tuple[str | None, str | None, list[Call]]  # (content, reasoning, calls)

WEATHER = '{"location": "Paris, France", "unit": "celsius"}'
LONDON = '{"location": "London", "unit": "celsius"}'
UNICODE = '{"location": "São Paulo", "note": "東京 ☔ 🌧", "escaped": "caf\\u00e9"}'
TRICKY = ('{"query": "a } ] \\" [ {", "filters": {"tags": ["x[1]", {"deep": [1, {"k": "}"}]}], '
          '"markers": "<tool_call> </tool_call> functools[ [TOOL_CALLS] [ARGS] <|python_tag|> ;"}}')
TIME_UTC = '{"tz": "UTC"}'


def splits(text: str) -> Iterator[list[str]]:
    yield [text]
    for cut in range(1, len(text)):
        yield [text[:cut], text[cut:]]
    yield list(text)


def streamed(parser: Any, chunks: list[str], cut: bool = False) -> Answer:
    deltas: list[ParsedDelta] = [parser.feed(chunk) for chunk in chunks]
    deltas.append(parser.finish(cut) if cut else parser.finish())
    calls: dict[int, list[str]] = {}
    ids: set[str] = set()
    for fragment in (fragment for delta in deltas for fragment in delta.tool_calls):
        if fragment.index not in calls:
            assert fragment.id and fragment.name and fragment.id not in ids
            ids.add(fragment.id)
            calls[fragment.index] = [fragment.name, fragment.arguments]
        else:
            assert fragment.id is None and fragment.name is None
            calls[fragment.index][1] += fragment.arguments
    assert list(calls) == list(range(len(calls)))
    content = "".join(delta.content for delta in deltas) or None
    reasoning = "".join(delta.reasoning for delta in deltas) or None
    return content, reasoning, [(name, arguments) for name, arguments in calls.values()]


def check_streaming(make: Callable[[], Any], text: str, expected: Answer, cut: bool = False) -> None:
    for chunks in splits(text):
        assert streamed(make(), chunks, cut) == expected, chunks


def case(parser: str, text: str, content: str | None, calls: Sequence[Call] = (), name: str = "") -> Any:
    return pytest.param(parser, text, content, list(calls), id=f"{parser}-{name}")


def coder(name: str, *parameters: tuple[str, str]) -> str:
    """A call as Qwen3-Coder writes it."""
    written = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters)
    return f"<tool_call>\n<function={name}>\n{written}</function>\n</tool_call>"


def hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def harmony(channel: str, text: str) -> str:
    """One gpt-oss message (the first one of an answer: the prompt wrote its `<|start|>assistant`)."""
    return f"<|channel|>{channel}<|message|>{text}<|end|>"


def harmony_call(name: str, arguments: str) -> str:
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}<|call|>"


def onyx(name: str, *parameters: tuple[str, str]) -> str:
    written = "".join(f'<atem:parameter name="{key}">{value}</atem:parameter>\n' for key, value in parameters)
    return f'<atem:function_calls>\n<atem:invoke name="{name}">\n{written}</atem:invoke>\n</atem:function_calls>'


TOOL_CASES = [
    case("hermes3", hermes("get_weather", WEATHER), None, [("get_weather", WEATHER)], "one"),
    case("hermes3", f"I'll check both cities.\n{hermes('get_weather', WEATHER)}\n{hermes('get_weather', LONDON)}\n"
         "Done.", "I'll check both cities.\n\n\nDone.",
         [("get_weather", WEATHER), ("get_weather", LONDON)], "two-with-text"),
    case("hermes3", '<tool_call>\n{"name": "get_time", "arguments": {}}', None, [("get_time", "{}")], "no-end-tag"),
    case("hermes3", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_ca', None, [("get_time", "{}")],
         "end-tag-cut"),
    case("hermes3", '<tool_call>\n{"name": "get_time", "arguments": {}}\n<tool_call>\n{"name": "get_time"}\n'
         "</tool_call>", None, [("get_time", "{}"), ("get_time", "{}")], "end-tag-forgotten-no-arguments"),
    case("hermes3", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par',
         'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par', [], "truncated"),
    case("hermes3", "<tool_call>\n{\"name\": \"f\", \"arguments\": {'a': 1}}\n</tool_call>\n"
         + hermes("get_time", TIME_UTC), "<tool_call>\n{\"name\": \"f\", \"arguments\": {'a': 1}}\n</tool_call>",
         [("get_time", TIME_UTC)], "bad-json-then-good"),
    case("hermes3", '<tool_call>\n{"arguments": {"x": 1}}\n</tool_call>',
         '<tool_call>\n{"arguments": {"x": 1}}\n</tool_call>', [], "no-name"),
    case("hermes3", '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}\n</tool_call>\nSorry.',
         '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}\n</tool_call>\nSorry.', [],
         "unbalanced"),
    case("hermes3", "<tool_call> is the tag; <tool_call without a bracket and <b>html</b>.",
         "<tool_call> is the tag; <tool_call without a bracket and <b>html</b>.", [], "marker-in-prose"),
    case("hermes3", "  The capital of France is Paris.\n", "The capital of France is Paris.", [], "no-calls"),
    case("hermes3", "", None, [], "empty"),
    case("hermes3", f"\n\n{hermes('get_weather', UNICODE)}\n\n", None, [("get_weather", UNICODE)], "unicode"),
    case("hermes3", hermes("search", TRICKY), None, [("search", TRICKY)], "tricky-strings"),
    case("hermes3", hermes("f", '"{\\"a\\": [1, 2]}"'), None, [("f", '{"a": [1, 2]}')], "arguments-as-string"),
    case("hermes3", hermes("f", '"hello"'), hermes("f", '"hello"'), [], "arguments-string-not-object"),
    case("hermes3", '<tool_call>\n{"name": "get_weather", "arguments": {\n    "location": "Paris"\n}}\n</tool_call>',
         None, [("get_weather", '{\n    "location": "Paris"\n}')], "guided-layout"),

    case("llama3", f'{{"name": "get_weather", "parameters": {WEATHER}}}', None, [("get_weather", WEATHER)], "one"),
    case("llama3", f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}', None,
         [("get_weather", WEATHER)], "python-tag"),
    case("llama3", f'\n {{"name": "get_weather", "parameters": {WEATHER}}}; {{"name": "get_time", "parameters": '
         f"{TIME_UTC}}}", None, [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two"),
    case("llama3", '{"name": "a", "arguments": {}}\n{"name": "b", "parameters": {}}', None,
         [("a", "{}"), ("b", "{}")], "newline-separated-arguments-key"),
    case("llama3", '{"name": "get_time", "parameters": {}}\n\nI have called the tool.', "I have called the tool.",
         [("get_time", "{}")], "text-after"),
    case("llama3", 'Sure! {"name": "get_time", "parameters": {}}', 'Sure! {"name": "get_time", "parameters": {}}',
         [], "text-before-is-content"),
    case("llama3", '{"answer": 42}', '{"answer": 42}', [], "json-not-a-call"),
    case("llama3", '{"name": "get_time", "parameters": {]}', '{"name": "get_time", "parameters": {]}', [],
         "bad-json"),
    case("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Par',
         '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Par', [], "truncated"),
    case("llama3", '{"name": "a", "parameters": {}}; {"name": 5}', '; {"name": 5}', [("a", "{}")],
         "good-then-bad"),
    case("llama3", '{"name": "a", "parameters": {}} ;\n', None, [("a", "{}")], "dangling-separator"),
    case("llama3", "Hello there. <|python_tag|> is a token.", "Hello there. <|python_tag|> is a token.", [],
         "no-calls"),
    case("llama3", "<|python", "<|python", [], "cut-tag"),
    case("llama3", f'{{"name": "get_weather", "parameters": {UNICODE}}}', None, [("get_weather", UNICODE)],
         "unicode"),
    case("llama3", f'{{"name": "search", "parameters": {TRICKY}}}', None, [("search", TRICKY)], "tricky-strings"),

    case("phi4", f'functools[{{"name": "get_weather", "arguments": {WEATHER}}}]', None, [("get_weather", WEATHER)],
         "one"),
    case("phi4", f'Let me look that up.\nfunctools[{{"name": "get_weather", "arguments": {WEATHER}}}, '
         f'{{"name": "get_time", "arguments": {TIME_UTC}}}]', "Let me look that up.",
         [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two-after-text"),
    case("phi4", 'functools[{"name": "get_time", "arguments": {}}] Hope that helps.', "Hope that helps.",
         [("get_time", "{}")], "text-after"),
    case("phi4", 'functools[{"arguments": {}}]', 'functools[{"arguments": {}}]', [], "no-name"),
    case("phi4", 'functools[{"name": "a", "arguments": {}}, 7]', 'functools[{"name": "a", "arguments": {}}, 7]', [],
         "one-element-not-a-call"),
    case("phi4", "functools[]", "functools[]", [], "empty-list"),
    case("phi4", 'functools[{"name": "get_weather", "arguments": {"location"',
         'functools[{"name": "get_weather", "arguments": {"location"', [], "truncated"),
    case("phi4", "Python's functools module has partial().", "Python's functools module has partial().", [],
         "no-calls"),
    case("phi4", f'functools [{{"name": "get_weather", "arguments": {UNICODE}}}]', None,
         [("get_weather", UNICODE)], "unicode-space"),
    case("phi4", f'functools[{{"name": "search", "arguments": {TRICKY}}}]', None, [("search", TRICKY)],
         "tricky-strings"),

    case("mistral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}}}]', None,
         [("get_weather", WEATHER)], "one"),
    case("mistral", f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {WEATHER}}}, {{"name": "get_time", '
         f'"arguments": {TIME_UTC}, "id": "a1B2c3D4e"}}]', None, [("get_weather", WEATHER), ("get_time", TIME_UTC)],
         "two-space-id"),
    case("mistral", f"[TOOL_CALLS]get_weather[ARGS]{WEATHER}", None, [("get_weather", WEATHER)], "args-form"),
    case("mistral", f"Sure.[TOOL_CALLS]get_weather[ARGS]{WEATHER}[TOOL_CALLS]get_time[ARGS]{TIME_UTC}", "Sure.",
         [("get_weather", WEATHER), ("get_time", TIME_UTC)], "args-form-repeated"),
    case("mistral", '[TOOL_CALLS]get_weather[ARGS]{"location": Paris}', '[TOOL_CALLS]get_weather[ARGS]{"location": '
         "Paris}", [], "args-form-bad-json"),
    case("mistral", "[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_wea", [], "args-form-truncated"),
    case("mistral", "[TOOL_CALLS]hello world [ARGS", "[TOOL_CALLS]hello world [ARGS", [], "name-without-args"),
    case("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"loc',
         '[TOOL_CALLS][{"name": "get_weather", "arguments": {"loc', [], "list-truncated"),
    case("mistral", "No tools needed: [TOOL_CALL] is not it.", "No tools needed: [TOOL_CALL] is not it.", [],
         "no-calls"),
    case("mistral", f"[TOOL_CALLS]get_weather[ARGS]{UNICODE}", None, [("get_weather", UNICODE)], "unicode"),
    case("mistral", f'[TOOL_CALLS][{{"name": "search", "arguments": {TRICKY}}}]', None, [("search", TRICKY)],
         "tricky-strings"),
    case("mistral", f"[TOOL_CALLS]search[ARGS] {TRICKY}", None, [("search", TRICKY)], "args-form-tricky"),

    # Qwen3-Coder-30B-A3B-Instruct's own layout: each value on its own lines, values as text.
    case("qwen3coder", coder("get_weather", ("location", "Paris, France"), ("unit", "celsius")), None,
         [("get_weather", WEATHER)], "one"),
    case("qwen3coder", "I'll check both.\n" + coder("get_weather", ("location", "Paris, France"), ("unit", "celsius"))
         + "\n" + coder("get_time", ("tz", "UTC")), "I'll check both.",
         [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two-after-text"),
    case("qwen3coder", coder("set_alarm", ("hour", "7"), ("repeat", "true"), ("days", '["mon", "tue"]'),
                             ("note", "wake up\nslowly"), ("zip", "007"), ("nothing", "null")), None,
         [("set_alarm", '{"hour": 7, "repeat": true, "days": ["mon", "tue"], "note": "wake up\\nslowly", '
                        '"zip": "007", "nothing": null}')], "typed-values"),
    case("qwen3coder", "<tool_call>\n<function=get_time>\n</function>", None, [("get_time", "{}")],
         "no-parameters-no-end-tag"),
    case("qwen3coder", "<tool_call>\n<function=get_time>\n</function>\n</tool_ca", None, [("get_time", "{}")],
         "end-tag-cut"),
    case("qwen3coder", "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar",
         "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", [], "truncated"),
    case("qwen3coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
         "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", [], "unclosed-parameter"),
    case("qwen3coder", "<tool_call>\n{\"name\": \"f\"}\n</tool_call> </function>",
         "<tool_call>\n{\"name\": \"f\"}\n</tool_call> </function>", [], "not-xml"),
    case("qwen3coder", coder("search", ("query", 'a } ] " [ { <tool_call> <b>x</b>')), None,
         [("search", '{"query": "a } ] \\" [ { <tool_call> <b>x</b>"}')], "tricky-text"),
    case("qwen3coder", coder("get_weather", ("location", "São Paulo 東京 ☔")) + "\nDone.", "Done.",
         [("get_weather", '{"location": "São Paulo 東京 ☔"}')], "unicode-text-after"),
    case("qwen3coder", "Plain <tool_call> talk.", "Plain <tool_call> talk.", [], "marker-in-prose"),

    case("devstral", f"[TOOL_CALLS]get_weather[ARGS]{WEATHER}", None, [("get_weather", WEATHER)], "one"),
    case("devstral", f"Let me see.[TOOL_CALLS]get_weather[ARGS]{WEATHER}[TOOL_CALLS]get_time[ARGS]{TIME_UTC}",
         "Let me see.", [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two"),
    case("devstral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}}}]', None,
         [("get_weather", WEATHER)], "list-form"),

    # gpt-oss (Harmony), decoded with special tokens kept; without a reasoning parser the analysis is dropped.
    case("gptoss", harmony("analysis", "User asks the weather in Paris. Use get_weather.")
         + "<|start|>assistant" + harmony_call("get_weather", '{"location":"Paris, France","unit":"celsius"}'),
         None, [("get_weather", '{"location":"Paris, France","unit":"celsius"}')], "analysis-then-call"),
    case("gptoss", harmony("analysis", "Simple.") + "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
         "2 + 2 = 4.", [], "final"),
    case("gptoss", "<|channel|>final<|message|>It is sunny in São Paulo ☔", "It is sunny in São Paulo ☔", [],
         "final-no-terminator"),
    case("gptoss", harmony("commentary", "Checking both cities.") + "<|start|>assistant"
         + harmony_call("get_weather", WEATHER) + "<|start|>assistant" + harmony_call("get_time", TIME_UTC),
         "Checking both cities.", [("get_weather", WEATHER), ("get_time", TIME_UTC)], "preamble-two-calls"),
    case("gptoss", '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"tz": "UTC"}',
         None, [("get_time", TIME_UTC)], "recipient-in-role-no-call-token"),
    case("gptoss", "<|channel|>commentary to=functions.ping <|constrain|>json<|message|><|call|>", None,
         [("ping", "{}")], "no-arguments"),
    case("gptoss", harmony_call("search", TRICKY), None, [("search", TRICKY)], "tricky-strings"),
    case("gptoss", '<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|call|>', None, [],
         "builtin-tool-dropped"),
    case("gptoss", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>",
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>", [], "bad-arguments"),
    case("gptoss", "Plain text from a model that wrote no header.", "Plain text from a model that wrote no header.",
         [], "no-harmony"),
    case("gptoss", "<|channel|>final", None, [], "header-cut"),
    case("gptoss", "<|channel|>final to=user<|message|>Hi.<|end|>", "Hi.", [], "to-user-is-content"),

    case("lfm2", "<|tool_call_start|>[get_weather(location=\"Paris, France\", unit='celsius')]<|tool_call_end|>",
         None, [("get_weather", WEATHER)], "one"),
    case("lfm2", "Let me check.<|tool_call_start|>[get_weather(location=\"Paris, France\", unit=\"celsius\"), "
         "get_time(tz='UTC')]<|tool_call_end|>I called both.", "Let me check.I called both.",
         [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two-with-text"),
    case("lfm2", "<|tool_call_start|>[set_alarm(hour=7, repeat=True, days=['mon', \"tue\"], note=None, "
         "opts={'loud': false, 'level': -2.5})]", None,
         [("set_alarm", '{"hour": 7, "repeat": true, "days": ["mon", "tue"], "note": null, '
                        '"opts": {"loud": false, "level": -2.5}}')], "typed-values-no-end-tag"),
    case("lfm2", "<|tool_call_start|>[get_time()]<|tool_call_end|>", None, [("get_time", "{}")], "no-arguments"),
    case("lfm2", "<|tool_call_start|>[get_weather(location=\"São Paulo 東京 ☔ ) ] , x\")]<|tool_call_end|>", None,
         [("get_weather", '{"location": "São Paulo 東京 ☔ ) ] , x"}')], "unicode-tricky"),
    case("lfm2", "<|tool_call_start|>[get_weather(\"Paris\")]<|tool_call_end|>",
         "<|tool_call_start|>[get_weather(\"Paris\")]<|tool_call_end|>", [], "positional-not-a-call"),
    case("lfm2", "<|tool_call_start|>[os.system(cmd=open('x').read())]<|tool_call_end|>",
         "<|tool_call_start|>[os.system(cmd=open('x').read())]<|tool_call_end|>", [], "not-a-literal"),
    case("lfm2", "<|tool_call_start|>[get_weather(location=\"Par", "<|tool_call_start|>[get_weather(location=\"Par",
         [], "truncated"),

    case("gemma4", "<|tool_call>call:get_weather{location:<|\"|>Paris, France<|\"|>,unit:<|\"|>celsius<|\"|>}"
         "<tool_call|>", None, [("get_weather", WEATHER)], "one"),
    case("gemma4", "I'll look.\n<|tool_call>call:get_weather{location:<|\"|>Paris, France<|\"|>,unit:<|\"|>celsius"
         "<|\"|>}<tool_call|><|tool_call>call:get_time{tz:<|\"|>UTC<|\"|>}<tool_call|>", "I'll look.",
         [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two-blocks"),
    case("gemma4", "<|tool_call>call:get_time{tz:<|\"|>UTC<|\"|>},call:ping{}<tool_call|>", None,
         [("get_time", TIME_UTC), ("ping", "{}")], "two-in-one-block"),
    case("gemma4", "<|tool_call>call:set_alarm{hour:7,repeat:true,days:[<|\"|>mon<|\"|>,<|\"|>tue<|\"|>],"
         "opts:{note:<|\"|>at 7:30, {really}<|\"|>,level:null}}", None,
         [("set_alarm", '{"hour": 7, "repeat": true, "days": ["mon", "tue"], "opts": {"note": "at 7:30, {really}", '
                        '"level": null}}')], "typed-values-no-end-tag"),
    case("gemma4", "<|tool_call>call:get_weather{location:Paris}<tool_call|>",
         "<|tool_call>call:get_weather{location:Paris}<tool_call|>", [], "bare-string-not-json"),
    case("gemma4", "<|tool_call>get_weather{}<tool_call|>", "<|tool_call>get_weather{}<tool_call|>", [],
         "no-call-prefix"),

    case("onyx", onyx("get_weather", ("location", "Paris, France"), ("unit", "celsius")), None,
         [("get_weather", WEATHER)], "one"),
    case("onyx", "Checking.\n<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter "
         "name=\"location\">Paris, France</atem:parameter>\n<atem:parameter name=\"unit\">celsius</atem:parameter>"
         "\n</atem:invoke>\n<atem:invoke name=\"get_time\">\n<atem:parameter name=\"tz\">UTC</atem:parameter>\n"
         "</atem:invoke>\n</atem:function_calls>\nDone.", "Checking.\n\nDone.",
         [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two-invokes-with-text"),
    case("onyx", onyx("set_alarm", ("hour", "7"), ("days", '["mon"]'), ("note", "a < b </x>")), None,
         [("set_alarm", '{"hour": 7, "days": ["mon"], "note": "a < b </x>"}')], "typed-values"),
    case("onyx", '<atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="a">1',
         '<atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="a">1', [], "truncated"),
    case("onyx", "<atem:function_calls></atem:function_calls>", "<atem:function_calls></atem:function_calls>", [],
         "empty-block"),

    case("minicpm5", '<function name="get_weather"><param name="location">Paris, France</param>'
         '<param name="unit">celsius</param></function>', None, [("get_weather", WEATHER)], "one"),
    case("minicpm5", 'Sure.\n<function name="get_weather">\n<param name="location">Paris, France</param>\n'
         '<param name="unit">celsius</param>\n</function>\n<function name="get_time"><param name="tz">UTC</param>'
         "</function>", "Sure.", [("get_weather", WEATHER), ("get_time", TIME_UTC)], "two-with-text"),
    case("minicpm5", "<function name=\"f\"><param name=\"tags\">['a', 'b']</param><param name=\"n\">3</param>"
         '<param name="ok">true</param></function>', None, [("f", '{"tags": ["a", "b"], "n": 3, "ok": true}')],
         "python-list-and-typed"),
    case("minicpm5", '<function name="get_time"></function>', None, [("get_time", "{}")], "no-parameters"),
    case("minicpm5", '<function name="f"><param name="a">1</function>',
         '<function name="f"><param name="a">1</function>', [], "unclosed-param"),
]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), TOOL_CASES)
def test_tool_parser_whole_and_streamed(parser: str, text: str, content: str | None, calls: list[Call]) -> None:
    kind = TOOL_PARSERS[parser]
    whole_content, whole_calls = kind().parse(text)
    assert (whole_content, [(call.name, call.arguments) for call in whole_calls]) == (content, calls)
    assert all(isinstance(json.loads(arguments), dict) for _, arguments in calls)
    check_streaming(kind, text, (content, None, calls))


REASONING_CASES = [
    (False, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", "The user greets me.",
     "Hello! How can I help?"),
    (True, "The user greets me.\n</think>\n\nHello!", "The user greets me.", "Hello!"),
    (False, "Hello without thinking.", None, "Hello without thinking."),
    (False, "<think>\nLet me count: 1, 2, 3", "Let me count: 1, 2, 3", None),
    (True, "Thinking that never ends </thin", "Thinking that never ends </thin", None),
    (False, "<think>\n\n</think>\n\nHi", None, "Hi"),
    (False, "\n <think>a < b </ c</think>answer", "a < b </ c", "answer"),
    (False, "<this is not a tag> </think>", None, "<this is not a tag> </think>"),
    (False, "Answer first <think>then this</think>", None, "Answer first <think>then this</think>"),
    (False, "<thi", None, "<thi"),
    (False, "", None, None),
]


@pytest.mark.parametrize(("opened", "text", "reasoning", "content"), REASONING_CASES)
def test_qwen3_whole_and_streamed(opened: bool, text: str, reasoning: str | None, content: str | None) -> None:
    assert Qwen3ReasoningParser(opened).parse(text) == (reasoning, content)
    check_streaming(lambda: Qwen3ReasoningParser(opened), text, (content, reasoning, []))


THINK_WITH_CALL = ("I need the weather. The format is <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n"
                   "</tool_call>, so I write that.")
OUTPUT_CASES = [
    ("qwen3", "hermes3", "<|im_start|>assistant\n",
     f"<think>\n{THINK_WITH_CALL}\n</think>\n\n{hermes('get_weather', WEATHER)}",
     (None, THINK_WITH_CALL, [("get_weather", WEATHER)])),
    ("qwen3", "hermes3", "<|im_start|>assistant\n<think>\n",
     f"{THINK_WITH_CALL}\n</think>\n\nLet me check.\n{hermes('get_weather', WEATHER)}",
     ("Let me check.", THINK_WITH_CALL, [("get_weather", WEATHER)])),
    ("qwen3", "hermes3", "<|im_start|>assistant\n", f"<think>\n{THINK_WITH_CALL}", (None, THINK_WITH_CALL, [])),
    ("qwen3", "hermes3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", hermes("get_time", "{}"),
     (None, None, [("get_time", "{}")])),
    ("qwen3", None, "", "<think>\nhmm\n</think>\n\n  Paris.  ", ("Paris.", "hmm", [])),
    (None, "hermes3", "", f"ok {hermes('get_time', '{}')}", ("ok", None, [("get_time", "{}")])),
    (None, None, "", "  untouched \n", ("  untouched \n", None, [])),
]


@pytest.mark.parametrize(("reasoning_parser", "tool_parser", "prompt", "text", "expected"), OUTPUT_CASES)
def test_output_parser_whole_and_streamed(reasoning_parser: str | None, tool_parser: str | None, prompt: str,
                                          text: str, expected: Answer) -> None:
    whole = output_parser(tool_parser, reasoning_parser, prompt).parse(text)
    content, reasoning, calls = expected
    assert (whole.content, whole.reasoning, [(call.name, call.arguments) for call in whole.tool_calls]) == expected
    check_streaming(lambda: output_parser(tool_parser, reasoning_parser, prompt), text, (content, reasoning, calls))


def test_content_streams_at_once_and_markers_are_held_back() -> None:
    parser = Hermes3ToolParser()
    assert parser.feed("Let me check. <tool").content == "Let me check."
    assert parser.feed("_call>\n").content == ""
    delta = parser.feed('{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert [(call.index, call.name, call.arguments) for call in delta.tool_calls] == [(0, "get_time", "{}")]
    assert parser.feed("\n<tool").content == ""
    assert parser.feed("box> is").content == " \n<toolbox> is"  # the space held back after "check."
    assert not parser.finish()


def test_calls_and_reasoning_are_sent_before_the_end() -> None:
    parser = OutputParser(Qwen3ReasoningParser(), Llama3ToolParser())
    assert parser.feed("<think>\nwhich").reasoning == "which"
    assert parser.feed(" tool\n</think>\n").reasoning == " tool"
    delta = parser.feed('{"name": "get_time", "parameters": {}}; ')
    assert delta.tool_calls == [ToolCallDelta(0, delta.tool_calls[0].id, "get_time", "{}")]
    assert parser.finish() == ParsedDelta()


PIECES = ["<tool_call>", "</tool_call>", "\n", " ", "{", "}", "[", "]", '"', "\\", ";", ",", "functools",
          '{"name": "f", "arguments": {"a": "}"}}', '{"name": "g", "parameters": {}}',
          '[{"name": "h", "arguments": {}}]', "[TOOL_CALLS]",
          "get", "[ARGS]", "<|python_tag|>", "<think>", "</think>", "hello", "é", "</",
          "<|channel|>", "commentary to=functions.f ", "<|message|>", "<|end|>", "<|call|>", "<|start|>", "final",
          "<|tool_call_start|>", "[f(a=1)]", "<|tool_call_end|>", "<|tool_call>", "call:f{a:<|\"|>x<|\"|>}",
          "<tool_call|>", "<atem:function_calls>", '<atem:invoke name="f">', "</atem:invoke>",
          "</atem:function_calls>", '<function name="f">', '<param name="a">', "</param>", "</function>"]


def test_random_outputs_stream_like_whole() -> None:
    """Marker and JSON fragments glued at random: whatever the parsers make of them, streaming must agree."""
    rng = random.Random(7)
    for _ in range(150):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 10)))
        cut = rng.randint(0, len(text))
        for kind in TOOL_PARSERS.values():
            for forced, length in ((False, False), (False, True), (True, True)):
                content, calls = kind(forced).parse(text, length)
                expected = (content, None, [(call.name, call.arguments) for call in calls])
                assert (streamed(kind(forced), [text[:cut], text[cut:]], length) == expected
                        == streamed(kind(forced), list(text), length)), text
        whole = output_parser("hermes3", "qwen3").parse(text)
        expected = (whole.content, whole.reasoning, [(call.name, call.arguments) for call in whole.tool_calls])
        assert streamed(output_parser("hermes3", "qwen3"), list(text)) == expected, text


def test_json_scanner_resumes_where_it_stopped() -> None:
    text = f"{TRICKY} and more"
    scanner = JsonScanner()
    for cut in range(1, len(text) + 1):
        assert scanner.end(text[:cut], 0, "{") == (len(TRICKY) if cut >= len(TRICKY) else None), cut
    assert JsonScanner().end(" {}", 1, "[") == NOT_JSON
    assert JsonScanner().end(r'x["\\"]', 1, "[") == 7  # an escaped backslash does not escape the quote
    assert JsonScanner().end(r'x["\"]', 1, "[") is None  # an escaped quote does not end the string


def test_parsed_delta_truth() -> None:
    assert not ParsedDelta()
    assert ParsedDelta(reasoning="x") and ParsedDelta(content="x") and ParsedDelta(tool_calls=[ToolCallDelta(0)])


def test_qwen3_opens() -> None:
    assert Qwen3ReasoningParser.opens("<|im_start|>assistant\n<think>\n")
    assert Qwen3ReasoningParser.opens("<think>")
    assert not Qwen3ReasoningParser.opens("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not Qwen3ReasoningParser.opens("<|im_start|>assistant\n")
    assert not Qwen3ReasoningParser.opens("<think> and then text")


def test_registries() -> None:
    assert set(TOOL_PARSERS) == {"hermes3", "llama3", "phi4", "mistral", "qwen3coder", "devstral", "gptoss", "lfm2",
                                 "gemma4", "onyx", "minicpm5"}
    assert set(REASONING_PARSERS) == {"qwen3", "gptoss", "gemma4", "lfm2", "onyx", "minicpm5"}
    assert all(kind.name == name for name, kind in {**TOOL_PARSERS, **REASONING_PARSERS}.items())


TOOLS = [
    Function("get_weather", {"type": "object", "properties": {"location": {"type": "string"},
                                                              "unit": {"enum": ["celsius", "fahrenheit"]}},
                             "required": ["location"]}),
    Function("search_docs", {"type": "object", "properties": {"query": {"type": "string"},
                                                              "filters": {"type": "object"}}}),
    Function("ping"),
]
INSTANCES = [{"location": "Zürich", "unit": "celsius"}, {"query": "a [b] {c} \"d\"", "filters": {"tags": ["x"]}},
             {}]
SEPARATOR = {"hermes3": "\n", "llama3": "; ", "phi4": "", "mistral": "", "devstral": ""}
GUIDED = sorted(name for name, kind in TOOL_PARSERS.items() if kind.guidable)  # what a model writes between calls


@pytest.mark.parametrize("parser", GUIDED)
@pytest.mark.parametrize("parallel", [False, True])
def test_auto_guidance_triggers_calls_in_free_text(parser: str, parallel: bool) -> None:
    tree = TOOL_PARSERS[parser]().guided(TOOLS, False, parallel)
    spec = tree["triggered_tags"]
    assert (spec["at_least_one"], spec["stop_after_first"]) == (False, not parallel)
    assert len(spec["tags"]) == len(TOOLS)
    for tool, node in zip(TOOLS, spec["tags"], strict=True):
        assert any(node["tag"]["begin"].startswith(trigger) for trigger in spec["triggers"])
        assert json.dumps(tool.name) in node["tag"]["begin"]
        assert node["tag"]["content"] == json_schema(tool.parameters)
    assert json.loads(json.dumps(tree)) == tree


def calls_only(tree: dict) -> dict:
    """The tags_with_separator node of a forced tree (inside the list's tag for list formats)."""
    if "tag" in tree:
        return tree["tag"]["content"]["tags_with_separator"]
    return tree["tags_with_separator"]


@pytest.mark.parametrize("parser", GUIDED)
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_guidance_is_the_calls_and_nothing_else(parser: str, parallel: bool) -> None:
    """No trigger, no free text: the grammar is exactly the call(s), so it ends, and with it the generation."""
    tree = TOOL_PARSERS[parser]().guided(TOOLS, True, parallel)
    assert "triggered_tags" not in json.dumps(tree)
    spec = calls_only(tree)
    assert (spec["at_least_one"], spec["stop_after_first"]) == (True, not parallel)
    assert [node["tag"]["content"] for node in spec["tags"]] == [json_schema(tool.parameters) for tool in TOOLS]


def written(node: dict, arguments: list[str]) -> str:
    """What a model writes under a forced tree, calling the tools in order with these arguments."""
    if "tags_with_separator" in node:
        spec = node["tags_with_separator"]
        tags = spec["tags"][: 1 if spec["stop_after_first"] else len(arguments)]
        return spec["separator"].join(written(tag, arguments) for tag in tags)
    begin, content, end = node["tag"]["begin"], node["tag"]["content"], node["tag"]["end"]
    inner = arguments.pop(0) if "json_schema" in content else written(content, arguments)
    return begin + inner + end


@pytest.mark.parametrize("parser", GUIDED)
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_output_parses_back_to_the_calls_alone(parser: str, parallel: bool) -> None:
    kind = TOOL_PARSERS[parser]
    arguments = [json.dumps(instance, indent=4, ensure_ascii=False) for instance in INSTANCES]
    text = written(kind().guided(TOOLS, True, parallel), list(arguments))
    count = len(TOOLS) if parallel else 1
    expected = [(tool.name, args) for tool, args in zip(TOOLS[:count], arguments[:count], strict=True)]
    content, calls = kind(forced=True).parse(text)
    assert (content, [(call.name, call.arguments) for call in calls]) == (None, expected)
    check_streaming(lambda: kind(forced=True), text, (None, None, expected))


@pytest.mark.parametrize("parser", GUIDED)
def test_auto_guided_tags_parse_back(parser: str) -> None:
    kind = TOOL_PARSERS[parser]
    tags = [node["tag"] for node in kind().guided(TOOLS, False, True)["triggered_tags"]["tags"]]
    written_args = [json.dumps(instance, indent=4, ensure_ascii=False) for instance in INSTANCES]
    texts = [tag["begin"] + arguments + tag["end"] for tag, arguments in zip(tags, written_args, strict=True)]
    expected = (None, None, [(tool.name, arguments) for tool, arguments in zip(TOOLS, written_args, strict=True)])
    check_streaming(kind, SEPARATOR[parser].join(texts), expected)


CUT_CASES = [  # (parser, forced, output cut by the token limit, content, calls)
    ("hermes3", True, "<", None, []),
    ("hermes3", True, '<tool_call>\n{"name": "get_weather", "arguments": {"loc', None, []),
    ("hermes3", True, f"{hermes('get_time', TIME_UTC)}\n<tool_call>\n{{", None, [("get_time", TIME_UTC)]),
    ("hermes3", False, "Sure. <tool_", "Sure.", []),
    ("hermes3", False, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par',
     "Checking.", []),
    ("hermes3", False, '<tool_call>\n{"arguments": {}} and', '<tool_call>\n{"arguments": {}} and', []),
    ("hermes3", False, "Plain text cut mid-wor", "Plain text cut mid-wor", []),
    ("llama3", True, '{"name": "get_weather", "parameters": {"loc', None, []),
    ("llama3", False, '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Par', None, []),
    ("llama3", False, '{"na', None, []),
    ("llama3", False, '{"answer": 4', '{"answer": 4', []),
    ("llama3", False, '{"name": "a", "parameters": {}}; {"name": "b", "param', None, [("a", "{}")]),
    ("llama3", False, "Hello", "Hello", []),
    ("phi4", True, "functools[", None, []),
    ("phi4", False, 'Let me look.\nfunctools[{"name"', "Let me look.", []),
    ("phi4", False, "Python's functoo", "Python's", []),
    ("mistral", True, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"na', None, []),
    ("mistral", False, "Sure.[TOOL_CALLS]get_wea", "Sure.", []),
    ("mistral", False, "Sure. [TOOL_C", "Sure.", []),
    ("qwen3coder", False, "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=loc", "Sure.", []),
    ("qwen3coder", False, "Sure. <tool_", "Sure.", []),
    ("devstral", False, "Sure.[TOOL_CALLS]get_wea", "Sure.", []),
    ("gptoss", False, '<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary '
     'to=functions.get_weather <|constrain|>json<|message|>{"location": "Pa', "Let me check.", []),
    ("gptoss", False, "<|channel|>final<|message|>Half an ans", "Half an ans", []),
    ("lfm2", False, 'Sure.<|tool_call_start|>[get_weather(location="Pa', "Sure.", []),
    ("gemma4", False, "Sure.<|tool_call>call:get_weather{location:<|\"|>Pa", "Sure.", []),
    ("onyx", False, 'Sure.\n<atem:function_calls>\n<atem:invoke name="get_w', "Sure.", []),
    ("minicpm5", False, 'Sure. <function name="get_weather"><param name="loc', "Sure.", []),
]


@pytest.mark.parametrize(("parser", "forced", "text", "content", "calls"), CUT_CASES)
def test_output_cut_by_the_token_limit_never_shows_call_markup(parser: str, forced: bool, text: str,
                                                             content: str | None, calls: list[Call]) -> None:
    kind = TOOL_PARSERS[parser]
    whole_content, whole_calls = kind(forced).parse(text, cut=True)
    assert (whole_content, [(call.name, call.arguments) for call in whole_calls]) == (content, calls)
    check_streaming(lambda: kind(forced), text, (content, None, calls), cut=True)


def test_a_forced_answer_has_no_content_even_when_it_ends_early() -> None:
    """Ended by a stop string, say: what is not a complete call is dropped, never content."""
    text = f"{hermes('get_time', TIME_UTC)}\n<tool_call>\n{{\"name\": \"get_wea"
    assert Hermes3ToolParser(forced=True).parse(text)[0] is None
    assert Hermes3ToolParser().parse(text)[0] == '<tool_call>\n{"name": "get_wea'
    check_streaming(lambda: Hermes3ToolParser(forced=True), text, (None, None, [("get_time", TIME_UTC)]))


def test_output_parser_passes_cut_and_forced_to_the_tool_parser() -> None:
    parser = output_parser("hermes3", "qwen3", "", forced=True)
    whole = parser.parse("<think>\nhm\n</think>\n\n<tool_ca", cut=True)
    assert (whole.content, whole.reasoning, whole.tool_calls) == (None, "hm", [])
    check_streaming(lambda: output_parser("hermes3", "qwen3", "", forced=False), "<think>\nhm\n</think>\n\n<tool_ca",
                    (None, "hm", []), cut=True)


def test_guided_needs_tools() -> None:
    with pytest.raises(ValueError):
        Hermes3ToolParser().guided([], required=True, parallel=False)


def test_mistral_call_ids_are_what_its_templates_accept() -> None:
    _, calls = MistralToolParser().parse('[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    _, calls = Hermes3ToolParser().parse('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert calls[0].id.startswith("call_")
