"""Tool calls on the built-in default model, as `ovq serve` ships it: forced calls end with the call, a call cut
by the token limit shows no markup, and LangChain's tool helpers work out of the box."""
from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import jsonschema
import pytest
from openai import OpenAI

from tests.conftest import MODEL, TOOLS, TOOLS_SPEC, WEATHER, Stack

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def streamed(client: OpenAI, args: dict[str, Any]) -> tuple[str, list[tuple[str, str]], str | None]:
    """A streamed answer's content, calls (name, arguments) and finish reason."""
    content = ""
    names: dict[int, str] = {}
    arguments: dict[int, str] = defaultdict(str)
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                if call.function.name:
                    names[call.index] = call.function.name
                arguments[call.index] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [(names[i], arguments[i]) for i in sorted(names)], finish


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_a_forced_call_ends_generation(client: OpenAI, tool_choice: Any, parallel: bool) -> None:
    """The issue's case: seed 1, max_tokens 80, OpenAI's sampling (the model's own, temperature 0.2, makes
    `required` with parallel calls repeat its call to the limit). Before, free text followed the call."""
    args = {"model": MODEL, "messages": WEATHER, "tools": TOOLS_SPEC, "tool_choice": tool_choice, "seed": 1,
            "max_tokens": 80, "parallel_tool_calls": parallel, "temperature": 1.0, "top_p": 1.0}
    reply = client.chat.completions.create(**args)
    choice = reply.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert calls and (parallel and tool_choice == "required" or len(calls) == 1)  # a named function: one call
    for name, arguments in calls:
        assert name == "get_weather" or tool_choice == "required"
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS_SPEC}[name]
        jsonschema.validate(json.loads(arguments), schema)
    assert reply.usage.completion_tokens < 80
    assert streamed(client, args) == ("", calls, "tool_calls")  # the same seed: the same calls, no content


@pytest.mark.parametrize("max_tokens", [1, 12])
def test_a_forced_call_cut_by_the_token_limit_shows_no_markup(client: OpenAI, max_tokens: int) -> None:
    args = {"model": MODEL, "messages": WEATHER, "tools": TOOLS_SPEC, "tool_choice": NAMED, "temperature": 0,
            "max_completion_tokens": max_tokens}
    choice = client.chat.completions.create(**args).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", None, None)
    assert streamed(client, args) == ("", [], "length")


@pytest.mark.parametrize("model", [MODEL, TOOLS], ids=["guided", "unguided"])
def test_a_call_the_model_starts_by_itself_cut_by_the_token_limit_is_not_content(client: OpenAI, model: str) -> None:
    """tool_choice `auto`: after a history of calls the model starts one by itself, and is cut inside it."""
    history: list[dict[str, Any]] = []
    for i, city in enumerate(["London", "Rome", "Madrid"]):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"location": city, "unit": "C"})}}
        history += [{"role": "user", "content": f"What is the weather like in {city} today?"},
                    {"role": "assistant", "content": None, "tool_calls": [call]}]
    args = {"model": model, "messages": history + WEATHER, "tools": TOOLS_SPEC, "temperature": 0}
    full = client.chat.completions.create(**args, max_tokens=60).choices[0]
    assert full.finish_reason == "tool_calls", "the model no longer calls by itself here: change the history"
    args["max_tokens"] = 8  # inside the call
    choice = client.chat.completions.create(**args).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", None, None)
    assert streamed(client, args) == ("", [], "length")


def test_langchain_bind_tools_and_function_calling_structured_output(stack: Stack) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    @tool
    def get_weather(location: str) -> str:
        """Current weather in a city."""
        return "sunny"

    class City(BaseModel):
        """A city and its country."""

        name: str = Field(description="the city's name")
        country: str = Field(description="the country it is in")

    llm = ChatOpenAI(model=MODEL, base_url=stack.base_url, api_key="unused", temperature=0, max_tokens=60,
                     max_retries=0, timeout=120)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"]["location"], str)
    # What a 135M model writes in the fields is its own affair; that it parses into the class is the API's.
    city = llm.with_structured_output(City, method="function_calling").invoke("Paris is the capital of France.")
    assert isinstance(city, City)


STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_output_has_no_whitespace_between_tokens(client: OpenAI, seed: int) -> None:
    """Sampled at temperature 1, the grammar used to let SmolLM2 pad JSON with blank lines up to the limit."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    args = {"model": MODEL, "messages": [{"role": "user", "content": "Extract the person: Nama is 31 years old."}],
            "response_format": fmt, "temperature": 1.0, "seed": seed, "max_tokens": 60}
    reply = client.chat.completions.create(**args)
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), PERSON)
    assert not re.search(r"\s", STRINGS.sub('""', text)), text
    streamed_text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args,
                                                                                                    stream=True)
                            if c.choices)
    assert streamed_text == text


def test_langchain_structured_output_fits_a_small_token_budget(stack: Stack) -> None:
    """with_structured_output's default method (a JSON schema response_format) at max_tokens 40."""
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    llm = ChatOpenAI(model=MODEL, base_url=stack.base_url, api_key="unused", max_tokens=40, seed=3,
                     max_retries=0, timeout=120)
    person = llm.with_structured_output(Person).invoke("Extract the person: Nama is 31 years old.")
    assert isinstance(person, Person) and person.name
