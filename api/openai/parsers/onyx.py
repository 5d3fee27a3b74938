"""Onyx: calls in `<atem:...>` XML, one or more invocations per block:

    <atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="location">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls>

Values are raw text: JSON other than a string is taken as that, anything else as a string (OVMS looks the type up
in the tool's schema; this parser sees no schemas).
"""
from __future__ import annotations

import re

from .xmlcalls import XmlToolParser


class OnyxToolParser(XmlToolParser):
    name = "onyx"
    marker = "<atem:function_calls>"
    trigger = "<atem:function_calls>"
    call_prefix = "<atem:function_calls>\n"
    call_suffix = "\n</atem:function_calls>"
    end = "</atem:function_calls>"
    function = re.compile(r'\s*<atem:invoke name="([^"\n]+)">')
    parameter = re.compile(r'\s*<atem:parameter name="([^"\n]+)">\n?(.*?)\n?</atem:parameter>', re.DOTALL)
    close = re.compile(r"\s*</atem:invoke>")
    wrapper_close = re.compile(r"\s*</atem:function_calls>")
