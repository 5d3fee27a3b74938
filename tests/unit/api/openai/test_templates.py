from __future__ import annotations

import pytest

from api.openai.templates import render
from common.errors import OvqError
from common.servable import DEFAULT_CHAT_TEMPLATE

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_chatml_renders_with_generation_prompt() -> None:
    out = render(CHATML, [{"role": "user", "content": "Hi"}], "<s>", "</s>")
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_default_template_takes_exactly_one_message() -> None:
    assert render(DEFAULT_CHAT_TEMPLATE, [{"role": "user", "content": "just this"}], "", "") == "just this"
    with pytest.raises(OvqError) as caught:
        render(DEFAULT_CHAT_TEMPLATE, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "", "")
    assert caught.value.status == 400
    assert "only single message" in str(caught.value)


def test_sandbox_refuses_python_internals() -> None:
    with pytest.raises(OvqError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [], "", "")


def test_helpers_transformers_templates_use() -> None:
    source = "{{ bos_token }}{{ messages | tojson }}{% if strftime_now('%Y') %}!{% endif %}{{ extra }}"
    out = render(source, [{"role": "user", "content": "é"}], "<s>", "", {"extra": "kw"})
    assert out == '<s>[{"role": "user", "content": "é"}]!kw'


def test_broken_template_is_a_400_not_a_crash() -> None:
    with pytest.raises(OvqError):
        render("{{ messages[5]['content'] + 1 }}", [{"role": "user", "content": "x"}], "", "")


def test_tool_call_arguments_reach_templates_as_objects() -> None:
    from api.openai.protocol import ChatMessage
    from api.openai.templates import template_message

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    message = template_message(ChatMessage(role="assistant", content=None, tool_calls=[call]), vision=False)
    assert message["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    broken = {**call, "function": {"name": "f", "arguments": "{not json"}}
    kept = template_message(ChatMessage(role="assistant", tool_calls=[broken]), vision=False)
    assert kept["tool_calls"][0]["function"]["arguments"] == "{not json"
