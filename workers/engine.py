"""The engine process: owns the ContinuousBatchingPipeline; tokenizes, adds, steps, reads and cancels.

`step()` holds the GIL for the whole step, so the engine runs in its own process and talks to the worker's
I/O process over a pipe in small batched messages:

  in  (list of commands): ["add", job, prompt, add_special_tokens, sampling params, images] | ["cancel", job]
                          | ["stop"]; images: base64 image files for vision-language models, in prompt order
  out (list of updates):  [job, new_token_ids, state, extra] with state None while running, else
                          "accepted" (extra: prompt tokens) | "stop" | "length" | "cancelled"
                          | "error" (extra: {status, message, param, code})

Prompts are tokenized here, as `add_request(prompt)` does in-process: the engine's OpenVINO threads are warm,
where a tokenizer in the I/O process pays a cold start on every sparse call (1-5 ms measured).
"""
from __future__ import annotations

import logging
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import orjson

from common.errors import OvqError
from common.jobs import SamplingParams
from workers.generation import engine_config, token_budget

log = logging.getLogger("ovq.engine")

# OpenVINO messages start with "Exception from <file>:<line>:" / "Check '<expr>' failed at <file>:<line>:" lines.
_LOCATION = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:\d+:)$")


def error_message(exc: BaseException) -> str:
    """The first line of an OpenVINO error that says what went wrong, not where (else the first line)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    for line in lines:
        if not _LOCATION.match(line):
            return line
    return lines[0] if lines else repr(exc)


@dataclass
class EngineSpec:
    path: str
    device: str
    scheduler: dict[str, Any]
    plugin_config: dict[str, Any]
    context_length: int
    cache_eviction: dict[str, Any] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None
    vision: bool = False  # a vision-language model directory: prompts come with images


def _scheduler_config(spec: EngineSpec) -> Any:
    import openvino_genai as g

    config = g.SchedulerConfig()
    for name, value in spec.scheduler.items():
        setattr(config, name, value)
    if spec.cache_eviction:
        eviction = dict(spec.cache_eviction)
        mode = getattr(g.AggregationMode, eviction.pop("aggregation_mode", "SUM"))
        config.use_cache_eviction = True
        config.cache_eviction_config = g.CacheEvictionConfig(
            eviction["start_size"], eviction["recent_size"], eviction["max_cache_size"], mode,
            eviction.get("apply_rotation", False),
        )
    return config


def refusal(job: str, exc: Exception) -> list[Any]:
    """The `error` update for a job refused before it ran: ours carry their status, GenAI's are 400s."""
    if isinstance(exc, OvqError):
        return [job, [], "error", {"status": exc.status, **exc.body.model_dump()}]
    return [job, [], "error", {"status": 400, "message": error_message(exc)}]


def tokenize(tokenizer: Any, prompt: str | list[int], add_special_tokens: bool, vocab_size: int | None) -> list[int]:
    """A prompt's ids: text through the tokenizer, ids checked against the vocabulary (a 400, not a crash)."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=add_special_tokens).input_ids.data[0].tolist()
    if vocab_size and any(not 0 <= i < vocab_size for i in prompt):
        raise OvqError(f"prompt token ids must be in [0, {vocab_size})", param="prompt")
    return prompt


def image_tensor(encoded: str) -> Any:
    """A base64 image file as the uint8 [1, H, W, 3] tensor vision pipelines take."""
    import base64
    import io

    import numpy as np
    import openvino as ov
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
        return ov.Tensor(np.asarray(image.convert("RGB"), dtype=np.uint8)[None])


def _generation_config(values: dict[str, Any]) -> Any:
    import openvino_genai as g

    config = g.GenerationConfig()
    for name, value in values.items():
        setattr(config, name, set(value) if name == "stop_strings" else value)
    config.validate()
    return config


class Engine:
    def __init__(self, spec: EngineSpec) -> None:
        import openvino_genai as g

        self._g = g
        self.spec = spec
        self.pipe = g.ContinuousBatchingPipeline(spec.path, _scheduler_config(spec), spec.device, spec.plugin_config)
        self.tokenizer = self.pipe.get_tokenizer()
        self.handles: dict[str, Any] = {}
        self.budgets: dict[str, int] = {}
        self.generated: dict[str, int] = {}
        self.next_id = 0

    def tokenize(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        return tokenize(self.tokenizer, prompt, add_special_tokens, self.spec.vocab_size)

    def add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any],
            images: list[str], out: list[list[Any]]) -> None:
        import numpy as np
        import openvino as ov

        try:
            ids = self.tokenize(prompt, add_special)
            sampling = SamplingParams.model_validate(params)
            budget = token_budget(sampling, self.spec.defaults, len(ids), self.spec.context_length)
            config = _generation_config(engine_config(sampling, self.spec.defaults, budget))
            tensor = ov.Tensor(np.asarray([ids], dtype=np.int64))
            self.next_id += 1
            if images:  # GenAI puts the image tokens where the rendered prompt has its image tags
                tensors = [image_tensor(b) for b in images]
                self.handles[job] = self.pipe.add_request(self.next_id, prompt, tensors, config)
            else:
                self.handles[job] = self.pipe.add_request(self.next_id, tensor, config)
        except Exception as exc:  # a prompt or a config refused is the request's fault
            out.append(refusal(job, exc))
            return
        self.budgets[job] = config.max_new_tokens
        self.generated[job] = 0
        out.append([job, [], "accepted", len(ids)])

    def cancel(self, job: str, out: list[list[Any]]) -> None:
        handle = self.handles.pop(job, None)
        tokens: list[int] = []
        if handle is not None:
            if handle.can_read():  # reading after cancel() raises
                for output in handle.read().values():
                    tokens.extend(output.generated_ids)
            handle.cancel()
            self._forget(job)
        out.append([job, tokens, "cancelled", None])

    def step(self, out: list[list[Any]]) -> None:
        self.pipe.step()
        g = self._g
        finished = []
        for job, handle in self.handles.items():
            tokens: list[int] = []
            reason = g.GenerationFinishReason.NONE
            if handle.can_read():
                for output in handle.read().values():
                    tokens.extend(output.generated_ids)
                    reason = output.finish_reason
            self.generated[job] += len(tokens)
            status = handle.get_status()
            finish, extra = None, None
            if status != g.GenerationStatus.RUNNING and not handle.can_read():
                finish = self._finish(job, status, reason)
                finished.append(job)
                if finish == "error":
                    extra = {"status": 500, "message": "the request did not fit in the KV cache; raise cache_size"}
            if tokens or finish:
                out.append([job, tokens, finish, extra])
        for job in finished:
            del self.handles[job]
            self._forget(job)

    def _finish(self, job: str, status: Any, reason: Any) -> str:
        g = self._g
        if status == g.GenerationStatus.IGNORED:
            return "error"
        if status in (g.GenerationStatus.CANCEL, g.GenerationStatus.STOP):
            return "cancelled"
        if reason == g.GenerationFinishReason.LENGTH or self.generated[job] >= self.budgets[job]:
            return "length"
        return "stop"

    def _forget(self, job: str) -> None:
        self.budgets.pop(job, None)
        self.generated.pop(job, None)


E = TypeVar("E")


def handshake(conn: Connection, factory: Callable[[], E]) -> E | None:
    """Build the engine and tell the I/O half it is ready, or why not (a device that cannot open)."""
    # The I/O half decides when the engine stops (after draining); a terminal's Ctrl-C is for it, not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = factory()
    except Exception as exc:
        conn.send_bytes(orjson.dumps({"ready": False, "error": error_message(exc)}))
        return None
    conn.send_bytes(orjson.dumps({"ready": True}))
    return engine


def run(conn: Connection, spec: EngineSpec) -> None:
    """Entry point of the engine process."""
    engine = handshake(conn, lambda: Engine(spec))
    if engine is None:
        return
    while True:
        out: list[list[Any]] = []
        timeout = 0 if engine.handles else None
        while conn.poll(timeout):
            try:
                commands = orjson.loads(conn.recv_bytes())
            except EOFError:
                return
            for command in commands:
                if command[0] == "add":
                    engine.add(command[1], command[2], command[3], command[4], command[5], out)
                elif command[0] == "cancel":
                    engine.cancel(command[1], out)
                elif command[0] == "stop":
                    for job in list(engine.handles):
                        engine.cancel(job, out)
                    return
            timeout = 0
        if out:  # accepted / refused / cancelled now, not after a step that may take a second
            conn.send_bytes(orjson.dumps(out))
            out = []
        if engine.handles:
            engine.step(out)
        if out:
            conn.send_bytes(orjson.dumps(out))
