"""The tool parser a chat template implies, from excerpts of the real templates of each family."""
from __future__ import annotations

import pytest

from common.models.parser_choice import reasoning_parser_for, tool_parser_for

QWEN3_CODER = ("{%- for tool in tools %}<function>{{ tool.name }}</function>{%- endfor %}If you choose to call a "
               "function ONLY reply in the following format:\n<tool_call>\n<function=example_function_name>\n"
               "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>")
QWEN3 = ("For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
         ' XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
DEVSTRAL = "{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' + tool_call.function.arguments|tojson }}"
MISTRAL = "{{- '[TOOL_CALLS][' }}{%- for tool_call in message.tool_calls %}{{- tool_call|tojson }}{%- endfor %}"
PHI4 = "{{ '<|tool|>' + message['tools'] + '<|/tool|>' }}... functools[{\"name\": ...}]"
LLAMA3 = ('{%- if builtin_tools is defined %}{{- "<|python_tag|>" }}{%- endif %}{{- "<|start_header_id|>ipython'
          '<|end_header_id|>" }}{"name": function name, "parameters": dictionary of argument name and its value}')
GPTOSS = ('{{- "<|start|>assistant<|channel|>commentary to=functions." + tool_call.name }}{{- " <|constrain|>json'
          '<|message|>" + tool_call.arguments|tojson + "<|call|>" }}')
LFM2 = "{{- '<|im_start|>system\\nList of tools: <|tool_list_start|>' + tools|tojson + '<|tool_list_end|>' }}"
GEMMA4 = "{{- '<|tool_call>call:' + tool_call['function']['name'] + '{' }}{{- '}<tool_call|>' }}"
ONYX = '<atem:function_calls>\n<atem:invoke name="{{ tool_call.name }}">'
MINICPM5 = '<function name="{{ tool_call.name }}">{% for k, v in args.items() %}<param name="{{ k }}">'
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>"
          "{% endfor %}")


@pytest.mark.parametrize(("template", "parser"), [
    (QWEN3_CODER, "qwen3coder"), (QWEN3, "hermes3"), (DEVSTRAL, "devstral"), (MISTRAL, "mistral"),
    (PHI4, "phi4"), (LLAMA3, "llama3"), (CHATML, None), ("", None), (GPTOSS, "gptoss"), (LFM2, "lfm2"),
    (GEMMA4, "gemma4"), (ONYX, "onyx"), (MINICPM5, "minicpm5"),
])
def test_the_template_names_its_call_format(template: str, parser: str | None) -> None:
    assert tool_parser_for(template) == parser


def test_only_harmony_implies_a_reasoning_parser() -> None:
    assert reasoning_parser_for(GPTOSS) == "gptoss"
    assert reasoning_parser_for(QWEN3) is None and reasoning_parser_for("") is None
