"""Devstral: Mistral's `[TOOL_CALLS]name[ARGS]{...}` form (and the older list form), under OVMS's own name."""
from __future__ import annotations

from .mistral import MistralToolParser


class DevstralToolParser(MistralToolParser):
    name = "devstral"
