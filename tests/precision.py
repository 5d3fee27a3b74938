"""The inference precision a test that compares numerics runs at.

OpenVINO's CPU plugin infers in bf16 by default where the CPU has AVX-512 BF16 or AMX, and in f32 elsewhere; small
models' greedy text legitimately differs between the two (a bf16 rounding flips near-ties). So a test that compares
numerics does one of two things, and says which:

- its claim holds at one precision only (a draft model's greedy text is the model's own, a continued stream is the
  uninterrupted one): it pins that precision in the engine's properties, `F32`, and runs so on every CPU;
- it compares like with like (ovq's answer against GenAI's own pipeline with the same properties, a batch against
  the same model alone, a voice against its embedding within a tolerance): it runs at the run's precision,
  `run_precision()`, and carries the `numerics` marker. CI runs those tests twice: at the CPU's default, then with
  `OVQ_TEST_PRECISION=f32` forced, so a runner without bf16 still runs the f32 half a bf16 host would run, and a
  bf16 host proves both.
"""
from __future__ import annotations

import functools
import os
from typing import Any

HINT = "INFERENCE_PRECISION_HINT"
# f32 throughout: the hint alone leaves the CPU plugin's dynamic quantization on, which rounds the activations of a
# model with compressed (int4/int8) weights to int8 per group, differently for a prefill than for step-by-step
# decoding (SmolLM2's Q4_1 weights: a continued job's log-probabilities 0.15 apart, its text a near-tie away).
F32: dict[str, str | int] = {HINT: "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


def forced() -> str:
    """The precision this run forces (`OVQ_TEST_PRECISION`), or "" for the CPU's default."""
    return os.environ.get("OVQ_TEST_PRECISION", "").strip().lower()


def run_precision() -> dict[str, str | int]:
    """The engine properties that put a like-with-like test at this run's precision ({} for the CPU's default)."""
    if not forced():
        return {}
    return dict(F32) if forced() == "f32" else {HINT: forced()}


def at_run_precision(plugin_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A servable's plugin_config at this run's precision; a precision the test pinned itself stays."""
    return {**run_precision(), **(plugin_config or {})}


def models_at_run_precision(models: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A models file's servables at this run's precision (unchanged unless the run forces one)."""
    if not forced():
        return models
    return {name: {**model, "plugin_config": at_run_precision(model.get("plugin_config"))}
            for name, model in models.items()}


def header() -> str:
    """One line: the CPU's default precision and this run's (pytest's header; `.ci/run` prints it before each half,
    since `-q` hides pytest's header)."""
    default = cpu_default()
    line = f"inference precision: the CPU's default is {default}; this run: {forced() or 'the default'}"
    if default != "bf16" and not forced():
        line += " (this CPU has no bf16: the default half runs at f32, as the forced half does)"
    return line


@functools.cache
def cpu_default() -> str:
    """What the CPU plugin infers in when nothing is asked: `bf16` on AVX-512 BF16 / AMX hosts, else `f32`."""
    import openvino as ov

    return ov.Core().get_property("CPU", HINT).get_type_name()
