"""The engine process: owns the ContinuousBatchingPipeline; tokenizes, adds, steps, reads and cancels.

`step()` holds the GIL for the whole step, so the engine runs in its own process and talks to the worker's
I/O process over two one-way pipes: `workers.engine.protocol` says what travels on them.

End-of-sequence ids are never text: one that ends a choice is not sent, only counted (the "stop" says so, as
OpenAI and vLLM count it in completion_tokens), and a choice GenAI ended with STOP is "stop" even when that id
was the last one the budget allowed.

Prompts are tokenized here, as `add_request(prompt)` does in-process: the engine's OpenVINO threads are warm,
where a tokenizer in the I/O process pays a cold start on every sparse call (1-5 ms measured).
"""
from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import orjson

from common import heap
from common.errors import OvqError
from common.jobs import SamplingParams
from workers.engine import lora, protocol
from workers.engine.arrivals import ArrivalWindow
from workers.engine.generation import choice_configs, prompt_param, token_budget
from workers.engine.prompt_length import prompt_length
from workers.engine.protocol import EngineSpec, Updates
from workers.engine.residual import residual
from workers.engine.structured import structured_config

log = logging.getLogger("ovq.engine")

# Draft tokens per step when a request names neither num_assistant_tokens nor assistant_confidence_threshold
# (GenAI's speculative decoding samples use 5, as its prompt lookup does).
DRAFT_TOKENS = 5

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


def _properties(spec: EngineSpec) -> dict[str, Any]:
    """The pipeline's properties: the plugin config, and the draft model for speculative decoding."""
    if not spec.draft:
        return spec.plugin_config
    import openvino_genai as g

    draft = spec.draft
    scheduler = g.SchedulerConfig()
    for name, value in draft["scheduler"].items():
        setattr(scheduler, name, value)
    # The draft runs at the model's inference precision: a bf16 draft under an f32 model proposes tokens from other
    # logits than the ones the f32 model verifies, and is accepted less often.
    precision = {k: v for k, v in spec.plugin_config.items() if k == "INFERENCE_PRECISION_HINT"}
    return {**spec.plugin_config, "draft_model": g.draft_model(draft["path"], draft["device"],
                                                              scheduler_config=scheduler, **precision)}


class Adapters:
    """The model's LoRA adapters and the one the batch runs with.

    GenAI 2026.4's continuous batching applies `GenerationConfig.adapters` only in `generate()`, which refuses a
    batch whose requests differ in them; the adapters it sets stay for the steps after it. So jobs run in groups of
    one adapter (or none): a job for another one waits until the batch has drained, then a one-token `generate`
    switches the pipeline to it. Every adapter is made alike first (`workers.engine.lora`: one rank, one set of
    layers) and the base model runs as the first adapter at alpha 0, so a switch changes values, never the shapes
    of GenAI's LoRA states: switching shapes under `step()` crashes the CPU plugin.
    """

    UNSET = "\0unset"  # before the first switch: GenAI applies nothing until a generate() names its adapters

    def __init__(self, declared: dict[str, dict[str, Any]]) -> None:
        self.declared = declared
        self.active: str | None = self.UNSET if declared else None
        self.waiting: dict[str, tuple[Any, ...]] = {}  # job -> its add's arguments, in arrival order
        self._adapters: dict[str, Any] = {}

    def properties(self, properties: dict[str, Any]) -> dict[str, Any]:
        """The pipeline properties, with every adapter registered (each switch then only changes alphas)."""
        if not self.declared:
            return properties
        import numpy as np
        import openvino as ov
        import openvino_genai as g

        alike = lora.alike({name: spec["path"] for name, spec in self.declared.items()})
        self._adapters = {name: g.Adapter(ov.Tensor(np.frombuffer(data, dtype=np.uint8).copy()))
                          for name, data in alike.items()}
        config = g.AdapterConfig(list(self._adapters.values()), g.AdapterConfig.Mode.MODE_DYNAMIC)
        return {**properties, "adapters": config}

    def wait(self, job: str, args: tuple[Any, ...]) -> None:
        self.waiting[job] = args

    def switch(self, pipe: Any, adapter: str | None, eos: int | None) -> None:
        import numpy as np
        import openvino as ov
        import openvino_genai as g

        drain(pipe)  # generate() needs no request in the pipeline, ended and cancelled ones included
        config = g.GenerationConfig(max_new_tokens=1)
        if adapter is None:  # the base model: an adapter at alpha 0 (an empty config would empty the states)
            config.adapters = g.AdapterConfig(next(iter(self._adapters.values())), 0.0)
        else:
            config.adapters = g.AdapterConfig(self._adapters[adapter], float(self.declared[adapter].get("alpha", 1.0)))
        pipe.generate([ov.Tensor(np.asarray([[max(eos or 0, 0)]], dtype=np.int64))], [config])
        self.active = adapter


def drain(pipe: Any) -> None:
    """Run the pipeline's requests out, then one empty step: GenAI frees a request's KV blocks at a step, and one
    cancelled (or ended) no longer counts as unfinished, so without it its blocks stay held."""
    while pipe.has_non_finished_requests():
        pipe.step()
    pipe.step()


def refusal(job: str, exc: Exception) -> list[Any]:
    """The `error` update for a job refused before it ran: ours carry their status, GenAI's are 400s."""
    if isinstance(exc, OvqError):
        return protocol.error(job, {"status": exc.status, **exc.body.model_dump()})
    return protocol.error(job, {"status": 400, "message": error_message(exc)})


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


def end_ids(ends: frozenset[int], sampling: SamplingParams) -> frozenset[int]:
    """The ids that end this job's answers: end of sequence (unless ignored) and the request's stop ids."""
    return frozenset((set() if sampling.ignore_eos else ends) | set(sampling.stop_token_ids or ()))


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
    ends: frozenset[int] = frozenset()
    generated: dict[int, int] = field(default_factory=dict)
    prefilled: bool = False  # some choice has produced a token: its prompt no longer waits for the scheduler
    computed: int = 0  # prompt tokens the scheduler has likely prefilled already (`Engine._prefilled`)
    # A trailing end-of-sequence id read but not yet sent: dropped if the choice ends there (ignore_eos goes on).
    held: dict[int, tuple[int, float | None]] = field(default_factory=dict)


class Engine:
    def __init__(self, spec: EngineSpec) -> None:
        import openvino_genai as g

        self._g = g
        self.spec = spec
        self.adapters = Adapters(spec.adapters)
        self.pipe = g.ContinuousBatchingPipeline(spec.path, _scheduler_config(spec), spec.device,
                                                 self.adapters.properties(_properties(spec)))
        self.tokenizer = self.pipe.get_tokenizer()
        self.requests: dict[str, Request] = {}
        self.next_id = 0
        self.eos = self.tokenizer.get_eos_token_id()
        self.ends = frozenset(i for i in (*spec.end_ids, self.eos) if i is not None and i >= 0)
        # Structured jobs added since the last step, with their prompt sizes: a grammar GenAI cannot compile
        # breaks the step after its add_request, so their `accepted` waits for that step (a 400 stays a 400).
        self.unstepped: dict[str, int] = {}
        # Every job added since the last step that succeeded: the suspects if the next step fails.
        self.added: set[str] = set()
        self.token_bytes: dict[int, bytes] | None = None  # the vocabulary as bytes, read at the first need

    def tokenize(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        return tokenize(self.tokenizer, prompt, add_special_tokens, self.spec.vocab_size)

    def add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any],
            images: list[str], resume: dict[str, Any] | None, out: Updates, kind: str = "chat") -> None:
        adapter = params.get("adapter")
        if adapter not in (None, *self.spec.adapters):
            out.append(refusal(job, OvqError(f"no LoRA adapter {adapter!r} on this model", param="model")))
            return
        if self.spec.adapters and (adapter != self.adapters.active or self.adapters.waiting):
            if self.requests or self.adapters.waiting:
                # One adapter per batch; once a job waits, later ones wait behind it, so no group starves.
                self.adapters.wait(job, (job, prompt, add_special, params, images, resume, kind))
                return
            self.adapters.switch(self.pipe, adapter, self.eos)
        self._add(job, prompt, add_special, params, images, resume, out, kind)

    def _add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any],
             images: list[str], resume: dict[str, Any] | None, out: Updates, kind: str) -> None:
        try:
            ids = self.tokenize(prompt, add_special)
            sampling = SamplingParams.model_validate(params)
            context = self.spec.context_length
            length = prompt_length(self.tokenizer, prompt, add_special, ids, context)
            budget = token_budget(sampling, self.spec.defaults, length, context, prompt_param(kind))
            configs = [self._config(c, sampling) for c in choice_configs(sampling, self.spec.defaults, budget)]
            tensors = [image_tensor(b) for b in images]
            handles, generated = self._add_choices(prompt, ids, tensors, configs, resume, sampling.structured)
        except Exception as exc:  # a prompt or a config refused is the request's fault
            out.append(refusal(job, exc))
            return
        beam = (sampling.best_of or 1) > 1
        ends = end_ids(self.ends, sampling)
        request = Request(handles, budget, len(ids), sampling.n, beam, sampling.echo and resume is None,
                          sampling.logprobs is not None, frozenset(ends), generated, prefilled=resume is not None)
        self.requests[job] = request
        self.added.add(job)
        if not handles:  # resumed with every choice finished already
            self._forget(job)
        elif sampling.structured is not None and resume is None:
            self.unstepped[job] = len(ids)
        elif resume is None:
            out.append(protocol.accepted(job, len(ids)))

    def _add_choices(self, prompt: str | list[int], ids: list[int], images: list[Any], configs: list[Any],
                     resume: dict[str, Any] | None, structure: dict[str, Any] | None = None,
                     ) -> tuple[dict[int, Any], dict[int, int]]:
        """One engine request per choice; a resumed choice goes on from the ids it had generated (a structured
        one under the grammar of what may follow them: GenAI's matcher would start the grammar over)."""
        if resume is None:
            return {i: self._add_request(prompt, ids, images, config) for i, config in enumerate(configs)}, {}
        if self.spec.vision or images:
            raise OvqError("the engine restarted and a vision job cannot be continued", 500, "server_error")
        previous_ids, done = protocol.resumed(resume)
        handles, generated = {}, {}
        for index, config in enumerate(configs):
            if index in done:
                continue
            previous = previous_ids.get(index, [])
            config.max_new_tokens = max(config.max_new_tokens - len(previous), 1)
            if structure is not None:
                config.structured_output_config = self._residual(structure, previous)
            handles[index] = self._add_request(prompt, ids + previous, images, config)
            generated[index] = len(previous)
        return handles, generated

    def _residual(self, structure: dict[str, Any], previous: list[int]) -> Any:
        """The grammar of what may follow the ids a structured choice had written (see workers.engine.residual).
        It is followed in characters, where xgrammar follows bytes: ids whose bytes are not whole, valid UTF-8 (a
        cut inside a character, or bytes a random model wrote) have no residual, and such a job ends with an
        error, as before."""
        written = self._written(previous)
        grammar = residual(structure, written) if written is not None else None
        if grammar is None:
            raise OvqError("this job's structured output cannot be continued from what it had written", 500,
                           "server_error")
        return self._g.StructuredOutputConfig(grammar=grammar)

    def _written(self, ids: list[int]) -> str | None:
        """The text of `ids` from their bytes, or None where it is not whole UTF-8 or the vocabulary is not bytes.
        Not GenAI's decode alone: it drops the bytes of an incomplete character without a trace, even mid-text."""
        if self.token_bytes is None:
            vocab = self.tokenizer.get_vocab()
            byte_level = bool(vocab) and all(isinstance(token, bytes) for token in vocab)
            self.token_bytes = {index: token for token, index in vocab.items()} if byte_level else {}
        try:
            text = b"".join(self.token_bytes[i] for i in ids).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            return None
        return text if text == self.tokenizer.decode(ids) else None  # special tokens, or not raw bytes

    def _config(self, values: dict[str, Any], sampling: SamplingParams) -> Any:
        config = _generation_config(values, self.eos)
        if sampling.structured is not None:
            config.structured_output_config = structured_config(sampling.structured)
        if self.spec.draft and config.assistant_confidence_threshold == 0 and not config.num_assistant_tokens:
            config.num_assistant_tokens = DRAFT_TOKENS  # GenAI's speculative decoding needs one of the two
        if self.spec.plugin_config.get("prompt_lookup"):
            # GenAI's prompt lookup needs both; these are its samples' values.
            config.num_assistant_tokens = values.get("num_assistant_tokens") or 5
            config.max_ngram_size = values.get("max_ngram_size") or 3
        return config

    def _add_request(self, prompt: str | list[int], ids: list[int], images: list[Any], config: Any) -> Any:
        import numpy as np
        import openvino as ov

        self.next_id += 1
        if self.spec.vision:
            # Vision pipelines embed the prompt themselves (their language model takes no input_ids: ids break
            # the step), putting the image tokens where the rendered prompt has its image tags.
            return self.pipe.add_request(self.next_id, str(prompt), images, config)
        return self.pipe.add_request(self.next_id, ov.Tensor(np.asarray([ids], dtype=np.int64)), config)

    def cancel(self, job: str, out: Updates, index: int | None = None) -> None:
        """Cancel a job (answered `cancelled`), or silently one choice the I/O half has finished already."""
        if index is None and self.adapters.waiting.pop(job, None) is not None:  # never added: nothing generated
            out.append(protocol.cancelled(job, []))
            return
        request = self.requests.get(job)
        if index is not None:
            handle = request.handles.pop(index, None) if request is not None and not request.beam else None
            if handle is not None:
                handle.cancel()
                if not request.handles:
                    self._forget(job)
                    # The batch may be empty now: nothing else would let a waiting group in (the engine blocks
                    # for its next command while no job runs).
                    self._next_adapter(out)
            return
        tokens: list[int] = []
        if request is not None:
            for handle in request.handles.values():
                if handle.can_read():  # reading after cancel() raises
                    for output in handle.read().values():
                        tokens.extend(output.generated_ids)
                handle.cancel()
            self._forget(job)
        out.append(protocol.cancelled(job, [i for i in tokens if i not in request.ends] if request else []))
        self._next_adapter(out)

    def stop(self, out: Updates) -> None:
        """Cancel every job (each answered), then let the scheduler free what they hold."""
        for job in list(self.adapters.waiting):
            self.cancel(job, out)
        for job in list(self.requests):
            self.cancel(job, out)
        self.release()

    def step(self, out: Updates) -> None:
        self.pipe.step()  # raises on a broken step: `run` reports the suspects and exits
        self._prefilled()
        self.added.clear()
        out.extend(protocol.accepted(job, prompt_len) for job, prompt_len in self.unstepped.items())
        self.unstepped.clear()
        for job, request in list(self.requests.items()):
            if request.beam:
                self._read_beams(job, request, out)
                continue
            for index, handle in list(request.handles.items()):
                if self._read_choice(job, request, index, handle, out) == protocol.ERROR:
                    for other in request.handles.values():  # the job has failed: its other choices too
                        other.cancel()
                    request.handles.clear()
                    break
            if not request.handles:
                self._forget(job)
        self._next_adapter(out)

    def _next_adapter(self, out: Updates) -> None:
        """Once the batch has drained, the jobs waiting for another adapter set go in, the longest waiting first."""
        while not self.requests and self.adapters.waiting:  # a group refused whole: on to the next
            first = next(iter(self.adapters.waiting.values()))
            adapter = first[3].get("adapter")
            if adapter != self.adapters.active:
                self.adapters.switch(self.pipe, adapter, self.eos)
            for job, args in list(self.adapters.waiting.items()):
                if args[3].get("adapter") == adapter:
                    del self.adapters.waiting[job]
                    self._add(*args[:6], out, args[6])

    def release(self) -> None:
        """Let the scheduler free what ended and cancelled requests hold: it does so at a step, and a cancelled
        request no longer counts as unfinished, so one empty step follows the last. Otherwise the blocks stay
        allocated while the engine idles, and GenAI logs them as leaked when the pipeline is destroyed."""
        try:
            drain(self.pipe)
        except Exception as exc:  # the next real step reports a broken pipeline
            log.warning("could not release the ended requests: %s", error_message(exc))

    def _prefilled(self) -> None:
        """What the step prefilled, as GenAI's split-fuse scheduler spends a step's budget: a token for each running
        sequence first, the rest on waiting prompts in the order they came. So a prompt longer than one step counts
        only what it still has to prefill: the worker sends the next job in time to fill the next step's budget,
        instead of after the first token (a burst of 16 prompts of 286 tokens came one per two steps)."""
        scheduler = self.spec.scheduler
        if not scheduler.get("dynamic_split_fuse", True):
            return
        running = [r for r in self.requests.values() if r.prefilled]
        budget = int(scheduler.get("max_num_batched_tokens") or 256) - sum(r.n for r in running)
        for request in self.requests.values():
            if budget <= 0:
                break
            if not request.prefilled:
                take = min(budget, request.prompt_len - request.computed)
                request.computed += take
                budget -= take

    def stats(self) -> list[Any]:
        metrics = self.pipe.get_metrics()
        waiting = sum(r.prompt_len - r.computed for r in self.requests.values() if not r.prefilled)
        return [metrics.requests, metrics.scheduled_requests, round(metrics.cache_usage, 1), waiting]

    def _read_choice(self, job: str, request: Request, index: int, handle: Any, out: Updates) -> str | None:
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
            out.append(protocol.update(job, tokens[:cut], protocol.PROMPT, None, index,
                                       logprobs[:cut] if request.logprobs else None))
            tokens, logprobs = tokens[cut:], logprobs[cut:]
        if tokens:
            request.prefilled = True
        tokens, logprobs = self._hold_end(request, index, tokens, logprobs)
        request.generated[index] = request.generated.get(index, 0) + len(tokens)
        status = handle.get_status()
        finish, extra = None, None
        if status != g.GenerationStatus.RUNNING and not handle.can_read():
            del request.handles[index]
            finish = self._finish(request, index, status, reason)
            if finish == protocol.ERROR:
                extra = {"status": 500, "message": "the request did not fit in the KV cache; raise cache_size"}
            elif finish == protocol.STOP and index in request.held:  # ended on its end-of-sequence id: counted
                extra = protocol.ENDED_ON_EOS
        if tokens and finish is None and not index and not request.logprobs:
            out.append(protocol.running(job, tokens))  # the usual update, short: the I/O half's fast path takes it
        elif tokens or finish:
            out.append(protocol.update(job, tokens, finish, extra, index, logprobs if request.logprobs else None))
        return finish

    @staticmethod
    def _hold_end(request: Request, index: int, tokens: list[int],
                  logprobs: list[float]) -> tuple[list[int], list[float]]:
        """Send an end-of-sequence id only once generation goes on after it (ignore_eos): if the choice ends
        there, it is neither text nor counted."""
        held = request.held.pop(index, None)
        if held is not None and tokens:
            tokens, logprobs = [held[0], *tokens], ([held[1], *logprobs] if logprobs else logprobs)
        elif held is not None:
            request.held[index] = held
        if tokens and tokens[-1] in request.ends:
            request.held[index] = (tokens[-1], logprobs[-1] if logprobs else None)
            tokens, logprobs = tokens[:-1], logprobs[:-1]
        return tokens, logprobs

    def _read_beams(self, job: str, request: Request, out: Updates) -> None:
        """Beam search hands out its beams when it ends: the `n` best, by score, are the choices."""
        g = self._g
        handle = request.handles[0]
        status = handle.get_status()
        if status == g.GenerationStatus.RUNNING:
            return
        outputs = list(handle.read().values()) if handle.can_read() else []
        self._forget(job)
        if status != g.GenerationStatus.FINISHED or not outputs:
            out.append(protocol.error(job, {"status": 500, "message": "beam search did not finish"}))
            return
        best = sorted(outputs, key=lambda o: o.score, reverse=True)[: request.n]
        for index, output in enumerate(best):
            ids = list(output.generated_ids)
            logprobs = list(output.generated_log_probs) if request.logprobs else None
            ended = bool(ids) and ids[-1] in request.ends
            if ended:
                ids, logprobs = ids[:-1], (logprobs[:-1] if logprobs else logprobs)
            reached = not ended and (output.finish_reason == g.GenerationFinishReason.LENGTH
                                     or len(ids) >= request.budget)
            state, extra = protocol.LENGTH if reached else protocol.STOP, protocol.ENDED_ON_EOS if ended else None
            out.append(protocol.update(job, ids, state, extra, index, logprobs))

    def _finish(self, request: Request, index: int, status: Any, reason: Any) -> str:
        g = self._g
        if status == g.GenerationStatus.IGNORED:
            return protocol.ERROR
        if status in (g.GenerationStatus.CANCEL, g.GenerationStatus.STOP):
            return protocol.CANCELLED
        if reason == g.GenerationFinishReason.STOP:
            return protocol.STOP  # an end id or stop string ended it, also when it was the last token allowed
        if reason == g.GenerationFinishReason.LENGTH or request.generated.get(index, 0) >= request.budget:
            return protocol.LENGTH
        return protocol.STOP

    def _forget(self, job: str) -> None:
        self.requests.pop(job, None)
        self.unstepped.pop(job, None)


E = TypeVar("E")


def handshake(outputs: Connection, factory: Callable[[], E]) -> E | None:
    """Build the engine and tell the I/O half it is ready, or why not (a device that cannot open)."""
    # The I/O half decides when the engine stops (after draining): a terminal's Ctrl-C or a Procfile runner's
    # SIGTERM to the whole group is for it, not for us. It stops us through the pipe, or we see it close.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = factory()
    except Exception as exc:
        answer = protocol.ready(error_message(exc))
        engine = None
    else:
        answer = protocol.ready()
        heap.settle()
    try:
        outputs.send_bytes(orjson.dumps(answer))
    except OSError:  # the I/O half stopped while the model loaded: nobody to serve
        return None
    return engine


def send(outputs: Connection, updates: Updates, stats: list[Any] | None = None) -> None:
    outputs.send_bytes(orjson.dumps(protocol.report(updates, stats)))


def _take(commands: Connection, outputs: Connection, engine: Engine, out: Updates, window: ArrivalWindow,
          ended: int) -> bool:
    """Apply every command waiting: block for one while no job runs; after a step that ended jobs, wait (as the
    window allows) until as many have been added. False when the engine stops (EOF or "stop")."""
    wait = window.wait(ended) if engine.requests else 0.0
    start = time.monotonic()
    timeout: float | None = wait if engine.requests else None
    added = 0
    while commands.poll(timeout):
        try:
            message = orjson.loads(commands.recv_bytes())
        except EOFError:  # the I/O half is gone: nobody to generate for; free the KV cache, so GenAI has no leak
            engine.stop([])  # to log as the pipeline is destroyed
            return False
        if not protocol.apply(engine, message, out):
            send(outputs, out)
            return False
        added += protocol.added(message)
        timeout = max(0.0, start + wait - time.monotonic()) if added < ended else 0
    if wait:
        window.spend(time.monotonic() - start)
    return True


def run(commands: Connection, outputs: Connection, spec: EngineSpec) -> None:
    """Entry point of the engine process: take every command waiting, step, report; exit on EOF or "stop"."""
    engine = handshake(outputs, lambda: Engine(spec))
    if engine is None:
        return
    window, ended = ArrivalWindow(spec.arrival_window_ms / 1000), 0
    busy = True  # so the first report says what the loaded engine holds before any job
    while True:
        if busy and not engine.requests:  # gone idle (its jobs ended or were cancelled): free, then say so
            engine.release()
            outputs.send_bytes(orjson.dumps(protocol.idle(engine.stats())))
            busy = False
        out: Updates = []
        if not _take(commands, outputs, engine, out, window, ended):
            return
        if out:  # accepted / refused / cancelled now, not after a step that may take a second
            send(outputs, out)
            out = []
        if not engine.requests:
            continue
        busy = True
        running, started = len(engine.requests), time.monotonic()
        try:
            engine.step(out)
        except Exception as exc:
            message = error_message(exc)
            log.error("engine step failed: %s", message)
            outputs.send_bytes(orjson.dumps(protocol.broken(message, sorted(engine.added))))
            return
        window.earn(time.monotonic() - started)
        ended = running - len(engine.requests)
        send(outputs, out, engine.stats())
