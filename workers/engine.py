"""The engine process: owns the ContinuousBatchingPipeline; tokenizes, adds, steps, reads and cancels.

`step()` holds the GIL for the whole step, so the engine runs in its own process and talks to the worker's
I/O process over a pipe in small batched messages:

  in  (list of commands): ["add", job, prompt, add_special_tokens, sampling params, images, kind]
                          | ["cancel", job] | ["stop"]; images: base64 image files for vision-language models,
                          in prompt order; kind: the job's ("chat" or "completion"), which names the field a
                          refusal of the prompt points at
  in  ["cancel", job, index]: the I/O half ended choice `index` itself (a stop string): drop it, no answer
  out (list of updates):  [job, new_token_ids, state, extra, index, logprobs] with state None while running,
                          else "accepted" (extra: prompt tokens) | "stop" | "length" | "cancelled"
                          | "error" (extra: {status, message, param, code}) | "prompt" (echo: the prompt's ids)
                          `index` (choice, default 0) and `logprobs` (one per id, or None) may be left off.

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
from workers.generation import choice_configs, prompt_param, token_budget
from workers.prompt_length import prompt_length
from workers.structured import structured_config

log = logging.getLogger("ovq.engine")

# OpenVINO messages start with "Exception from <file>:<line>:" / "Check '<expr>' failed at <file>:<line>:" lines.
_LOCATION = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:\d+:)$")
# xgrammar prefixes its messages with "[HH:MM:SS] /path/file.cc:123: ".
_XGRAMMAR = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def error_message(exc: BaseException) -> str:
    """The first line of an OpenVINO error that says what went wrong, not where (else the first line)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    for line in lines:
        if not _LOCATION.match(line):
            return _XGRAMMAR.sub("", line)
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


def _generation_config(values: dict[str, Any], eos: int | None = None) -> Any:
    import openvino_genai as g

    config = g.GenerationConfig()
    for name, value in values.items():
        setattr(config, name, set(value) if name in ("stop_strings", "stop_token_ids") else value)
    if values.get("stop_token_ids") and eos is not None:  # extra stop ids, not instead of the end of sequence
        config.stop_token_ids = {*values["stop_token_ids"], eos}
    config.validate()
    return config


@dataclass
class Request:
    """One job in the pipeline: a handle per choice, or one handle whose beams are all the choices."""

    handles: dict[int, Any]
    budget: int
    prompt_len: int
    n: int
    beam: bool
    echo: bool
    logprobs: bool
    generated: dict[int, int] = field(default_factory=dict)


class Engine:
    def __init__(self, spec: EngineSpec) -> None:
        import openvino_genai as g

        self._g = g
        self.spec = spec
        self.pipe = g.ContinuousBatchingPipeline(spec.path, _scheduler_config(spec), spec.device, spec.plugin_config)
        self.tokenizer = self.pipe.get_tokenizer()
        self.requests: dict[str, Request] = {}
        self.next_id = 0
        # Structured jobs added since the last step, with their prompt sizes: a grammar GenAI cannot compile
        # breaks the step after its add_request, so their `accepted` waits for that step (a 400 stays a 400).
        self.unstepped: dict[str, int] = {}

    def tokenize(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        return tokenize(self.tokenizer, prompt, add_special_tokens, self.spec.vocab_size)

    def add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any],
            images: list[str], out: list[list[Any]], kind: str = "chat") -> None:
        try:
            ids = self.tokenize(prompt, add_special)
            sampling = SamplingParams.model_validate(params)
            context = self.spec.context_length
            length = prompt_length(self.tokenizer, prompt, add_special, ids, context)
            budget = token_budget(sampling, self.spec.defaults, length, context, prompt_param(kind))
            configs = [self._config(c, sampling) for c in choice_configs(sampling, self.spec.defaults, budget)]
            tensors = [image_tensor(b) for b in images]
            handles = {i: self._add_request(prompt, ids, tensors, config) for i, config in enumerate(configs)}
        except Exception as exc:  # a prompt or a config refused is the request's fault
            out.append(refusal(job, exc))
            return
        beam = (sampling.best_of or 1) > 1
        self.requests[job] = Request(handles, budget, len(ids), sampling.n, beam, sampling.echo,
                                     sampling.logprobs is not None)
        if sampling.structured is not None:
            self.unstepped[job] = len(ids)
        else:
            out.append([job, [], "accepted", len(ids)])

    def _config(self, values: dict[str, Any], sampling: SamplingParams) -> Any:
        config = _generation_config(values, self.tokenizer.get_eos_token_id())
        if sampling.structured is not None:
            config.structured_output_config = structured_config(sampling.structured)
        if self.spec.plugin_config.get("prompt_lookup"):
            # GenAI's prompt lookup needs both; these are its samples' values.
            config.num_assistant_tokens = values.get("num_assistant_tokens") or 5
            config.max_ngram_size = values.get("max_ngram_size") or 3
        return config

    def _add_request(self, prompt: str | list[int], ids: list[int], images: list[Any], config: Any) -> Any:
        import numpy as np
        import openvino as ov

        self.next_id += 1
        if images:  # GenAI puts the image tokens where the rendered prompt has its image tags
            return self.pipe.add_request(self.next_id, prompt, images, config)
        return self.pipe.add_request(self.next_id, ov.Tensor(np.asarray([ids], dtype=np.int64)), config)

    def cancel(self, job: str, out: list[list[Any]], index: int | None = None) -> None:
        """Cancel a job (answered `cancelled`), or silently one choice the I/O half has finished already."""
        request = self.requests.get(job)
        if index is not None:
            handle = request.handles.pop(index, None) if request is not None and not request.beam else None
            if handle is not None:
                handle.cancel()
                if not request.handles:
                    self._forget(job)
            return
        tokens: list[int] = []
        if request is not None:
            for handle in request.handles.values():
                if handle.can_read():  # reading after cancel() raises
                    for output in handle.read().values():
                        tokens.extend(output.generated_ids)
                handle.cancel()
            self._forget(job)
        out.append([job, tokens, "cancelled", None])

    def step(self, out: list[list[Any]]) -> None:
        try:
            self.pipe.step()
        except Exception as exc:
            self._broken(exc, out)
            raise
        out.extend([job, [], "accepted", prompt_len] for job, prompt_len in self.unstepped.items())
        self.unstepped.clear()
        for job, request in list(self.requests.items()):
            if request.beam:
                self._read_beams(job, request, out)
                continue
            for index, handle in list(request.handles.items()):
                if self._read_choice(job, request, index, handle, out) == "error":
                    for other in request.handles.values():  # the job has failed: its other choices too
                        other.cancel()
                    request.handles.clear()
                    break
            if not request.handles:
                self._forget(job)

    def _read_choice(self, job: str, request: Request, index: int, handle: Any, out: list[list[Any]]) -> str | None:
        g = self._g
        tokens: list[int] = []
        logprobs: list[float] = []
        reason = g.GenerationFinishReason.NONE
        if handle.can_read():
            for output in handle.read().values():
                tokens.extend(output.generated_ids)
                logprobs.extend(output.generated_log_probs)
                reason = output.finish_reason
        if request.echo and index not in request.generated and tokens:
            # GenAI's echo puts the prompt (with its log-probabilities) before the first generated token.
            cut = request.prompt_len
            out.append([job, tokens[:cut], "prompt", None, index, logprobs[:cut] if request.logprobs else None])
            tokens, logprobs = tokens[cut:], logprobs[cut:]
        request.generated[index] = request.generated.get(index, 0) + len(tokens)
        status = handle.get_status()
        finish, extra = None, None
        if status != g.GenerationStatus.RUNNING and not handle.can_read():
            del request.handles[index]
            finish = self._finish(request, index, status, reason)
            if finish == "error":
                extra = {"status": 500, "message": "the request did not fit in the KV cache; raise cache_size"}
        if tokens or finish:
            out.append([job, tokens, finish, extra, index, logprobs if request.logprobs else None])
        return finish

    def _read_beams(self, job: str, request: Request, out: list[list[Any]]) -> None:
        """Beam search hands out its beams when it ends: the `n` best, by score, are the choices."""
        g = self._g
        handle = request.handles[0]
        status = handle.get_status()
        if status == g.GenerationStatus.RUNNING:
            return
        outputs = list(handle.read().values()) if handle.can_read() else []
        self._forget(job)
        if status != g.GenerationStatus.FINISHED or not outputs:
            out.append([job, [], "error", {"status": 500, "message": "beam search did not finish"}])
            return
        best = sorted(outputs, key=lambda o: o.score, reverse=True)[: request.n]
        for index, output in enumerate(best):
            ids = list(output.generated_ids)
            reached = output.finish_reason == g.GenerationFinishReason.LENGTH or len(ids) >= request.budget
            logprobs = list(output.generated_log_probs) if request.logprobs else None
            out.append([job, ids, "length" if reached else "stop", None, index, logprobs])

    def _finish(self, request: Request, index: int, status: Any, reason: Any) -> str:
        g = self._g
        if status == g.GenerationStatus.IGNORED:
            return "error"
        if status in (g.GenerationStatus.CANCEL, g.GenerationStatus.STOP):
            return "cancelled"
        if reason == g.GenerationFinishReason.LENGTH or request.generated.get(index, 0) >= request.budget:
            return "length"
        return "stop"

    def _broken(self, exc: Exception, out: list[list[Any]]) -> None:
        """A failed step leaves the pipeline unusable: jobs added since the last step caused it (a grammar
        GenAI could not compile) and get a 400; the others a 500. The process then exits and is restarted."""
        message = error_message(exc)
        log.error("engine step failed: %s", message)
        for job in list(self.requests):
            if job in self.unstepped:
                out.append([job, [], "error", {"status": 400, "message": f"invalid structured output: {message}",
                                               "param": "response_format"}])
            else:
                out.append([job, [], "error", {"status": 500, "message": "the inference engine failed a step "
                                               "because of another request and was restarted"}])
        self.requests.clear()

    def _forget(self, job: str) -> None:
        self.requests.pop(job, None)
        self.unstepped.pop(job, None)


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
        timeout = 0 if engine.requests else None
        while conn.poll(timeout):
            try:
                commands = orjson.loads(conn.recv_bytes())
            except EOFError:
                return
            for command in commands:
                if command[0] == "add":
                    engine.add(*command[1:6], out, *command[6:7])
                elif command[0] == "cancel":
                    engine.cancel(command[1], out, command[2] if len(command) > 2 else None)
                elif command[0] == "stop":
                    for job in list(engine.requests):
                        engine.cancel(job, out)
                    return
            timeout = 0
        if out:  # accepted / refused / cancelled now, not after a step that may take a second
            conn.send_bytes(orjson.dumps(out))
            out = []
        if engine.requests:
            try:
                engine.step(out)
            finally:
                if out:
                    conn.send_bytes(orjson.dumps(out))
