"""The stateful engine process: one `LLMPipeline` (OVMS's "stateful" servable, what NPU runs), one job at a time.

It speaks the same pipe protocol as `workers.engine.continuous` (`workers.engine.protocol`) and has the same
`run(conn, spec)` entry point, so the I/O half can drive either engine; with this one it should keep one job in
flight (capacity 1).

Design:
- `LLMPipeline.generate()` releases the GIL but blocks until the whole answer is made, so it runs in a thread of
  this process while the main loop keeps reading the pipe: a cancel arriving mid-generation is seen at once.
- The generation thread hands token ids to the main loop through a lock-protected list (`_IdStreamer`) and wakes
  it through an `os.pipe`; the main loop waits on the engine pipe and that wake pipe together (no polling) and
  sends one update per batch of new ids, as the CB engine sends one per step.
- Jobs that arrive while one runs are tokenized, checked and answered `accepted` at once (as the CB engine does),
  then queued here in order; the next starts when the generation thread ends.
- A cancel of the running job is answered `cancelled` at once; the streamer then returns `CANCEL` at the next
  token, which ends `generate()`; what it made after the cancel is dropped, and only then does the next job start
  (the stateful pipeline can run one generation at a time).
- The pipeline gets input ids, never a string, so it applies no chat template (the prompt is already rendered).
- Finish reasons are exact: "length" when `max_new_tokens` was reached, else "stop" (OVMS's stateful servable
  always says "stop"). The ids sent always add up to what was generated: the final update carries any ids the
  streamer did not see (checked against `EncodedResults.tokens`).
"""
from __future__ import annotations

import logging
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from functools import cache
from multiprocessing.connection import Connection, wait
from typing import Any

import orjson

from common.errors import OvqError
from common.jobs import SamplingParams
from workers.engine import protocol
from workers.engine.continuous import (
    _generation_config,
    end_ids,
    error_message,
    handshake,
    image_tensor,
    refusal,
    send,
    tokenize,
)
from workers.engine.generation import engine_config, prompt_param, token_budget
from workers.engine.prompt_length import prompt_length
from workers.engine.protocol import EngineSpec, Updates
from workers.engine.structured import structured_config

log = logging.getLogger("ovq.stateful_engine")

# NPU plugin properties: the prompt and answer sizes its static KV cache is compiled for.
NPU_PROMPT_LEN, NPU_RESPONSE_LEN = 1024, 128
NPU_ONLY = ("MAX_PROMPT_LEN", "MIN_RESPONSE_LEN")
# Request values asking for several sequences; SamplingParams drops unknown keys, so look at the raw dict.
MULTI_SEQUENCE = ("n", "best_of", "num_return_sequences", "num_beams")
STOP_JOIN_S = 30.0

def is_npu(device: str) -> bool:
    return device.split(":")[0].split(".")[0].upper() == "NPU"


def pipeline_properties(spec: EngineSpec) -> tuple[dict[str, Any], int | None, int]:
    """The properties for `LLMPipeline`, the prompt limit to enforce (if any), and the context it can hold."""
    properties = dict(spec.plugin_config)
    limit = properties.get("MAX_PROMPT_LEN")
    context = spec.context_length
    if is_npu(spec.device):
        limit = int(limit) if limit is not None else NPU_PROMPT_LEN
        # The NPU KV cache is static: generation stops silently when it is full, so budget within it.
        context = min(context, limit + int(properties.get("MIN_RESPONSE_LEN", NPU_RESPONSE_LEN)))
    else:
        for name in NPU_ONLY:  # other plugins refuse them ("Unsupported property MAX_PROMPT_LEN by CPU plugin")
            properties.pop(name, None)
        limit = int(limit) if limit is not None else None
    return properties, limit, context


@cache
def _streamer_class() -> type:
    """Built on first use: importing openvino_genai where this module is imported (the I/O half) is costly."""
    import openvino_genai as g

    class IdStreamer(g.StreamerBase):
        """Collects the ids `generate()` makes for the main loop; asks GenAI to stop once the job is cancelled."""

        def __init__(self, wake: Any) -> None:
            super().__init__()
            self._wake = wake
            self._lock = threading.Lock()
            self._ids: list[int] = []
            self.cancelled = False

        def write(self, token: int | list[int]) -> Any:
            with self._lock:
                first = not self._ids
                if isinstance(token, int):
                    self._ids.append(token)
                else:
                    self._ids.extend(token)
            if first:  # the main loop takes everything on waking: one wake per batch is enough
                self._wake()
            return g.StreamingStatus.CANCEL if self.cancelled else g.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

        def take(self) -> list[int]:
            with self._lock:
                ids, self._ids = self._ids, []
            return ids

    return IdStreamer


@dataclass
class Pending:
    job: str
    ids: list[int]
    config: Any
    budget: int
    ends: frozenset[int] = frozenset()  # ids that end the answer: neither text nor counted
    prompt: str = ""  # vision: GenAI places the images at the image tags of the rendered prompt
    images: list[str] = field(default_factory=list)


@dataclass
class Running:
    pending: Pending
    streamer: Any
    thread: threading.Thread | None = None
    sent: list[int] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    answered: bool = False  # `cancelled` already sent: drop whatever comes after
    held: list[int] = field(default_factory=list)  # a trailing end-of-sequence id not sent yet

    @property
    def job(self) -> str:
        return self.pending.job


class StatefulEngine:
    def __init__(self, spec: EngineSpec) -> None:
        import openvino_genai as g

        self._g = g
        self.spec = spec
        properties, self.max_prompt_len, self.context = pipeline_properties(spec)
        pipeline = g.VLMPipeline if spec.vision else g.LLMPipeline
        self.pipe = pipeline(spec.path, spec.device, **properties)
        self.tokenizer = self.pipe.get_tokenizer()
        eos = self.tokenizer.get_eos_token_id()
        self.ends = frozenset(i for i in (*spec.end_ids, eos) if i is not None and i >= 0)
        self.queue: deque[Pending] = deque()
        self.running: Running | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @property
    def wake_fd(self) -> int:
        return self._wake_r

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of wakes already
            pass

    def _drain_wakes(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    # ---- commands ------------------------------------------------------------------------------------
    def add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any],
            images: list[str], resume: Any, out: Updates, kind: str = "chat") -> None:
        try:
            pending = self._prepare(job, prompt, add_special, params, prompt_param(kind))
            if self.spec.vision:
                pending.prompt, pending.images = str(prompt), images
        except Exception as exc:  # a prompt or a config refused is the request's fault
            out.append(refusal(job, exc))
            return
        out.append(protocol.accepted(job, len(pending.ids)))
        self.queue.append(pending)
        self._start_next()

    def _prepare(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any],
                 param: str = "messages") -> Pending:
        for name in MULTI_SEQUENCE:
            if (params.get(name) or 1) > 1:
                raise _one_sequence(name)
        ids = tokenize(self.tokenizer, prompt, add_special, self.spec.vocab_size)
        length = prompt_length(self.tokenizer, prompt, add_special, ids, self.context)
        if self.max_prompt_len is not None and length > self.max_prompt_len:
            raise OvqError(
                f"prompt is {length} tokens, over MAX_PROMPT_LEN {self.max_prompt_len} of this stateful servable",
                param=param, code="context_length_exceeded",
            )
        sampling = SamplingParams.model_validate(params)
        budget = token_budget(sampling, self.spec.defaults, length, self.context, param)
        config = _generation_config(engine_config(sampling, self.spec.defaults, budget),
                                    self.tokenizer.get_eos_token_id())
        if config.num_return_sequences > 1 or config.is_beam_search():
            raise _one_sequence("n")
        if sampling.structured is not None:
            config.structured_output_config = structured_config(sampling.structured)
        config.apply_chat_template = False  # input ids bypass it anyway; say so in case a string ever gets here
        return Pending(job, ids, config, config.max_new_tokens, end_ids(self.ends, sampling))

    def cancel(self, job: str, out: Updates, index: int | None = None) -> None:
        """Cancel a job, answered `cancelled`. A job here has one choice: a cancel of choice 0 (the I/O half ended
        it at a stop string) cancels the job, and the I/O half ignores the answer for a job it has ended."""
        running = self.running
        if running is not None and running.job == job and not running.answered:
            running.streamer.cancelled = True
            running.answered = True
            out.append(protocol.cancelled(job, running.streamer.take()))
            return
        queued = [p for p in self.queue if p.job == job]
        for pending in queued:
            self.queue.remove(pending)
        # Unknown jobs get an answer too: the I/O half ignores it for jobs it has finished already.
        out.append(protocol.cancelled(job, []))

    def stop(self, out: Updates) -> None:
        """Cancel everything and wait for the generation thread, so the pipeline is not destroyed under it."""
        if self.running is not None:
            self.cancel(self.running.job, out)
        for pending in list(self.queue):
            self.cancel(pending.job, out)
        if self.running is not None and self.running.thread is not None:
            self.running.thread.join(STOP_JOIN_S)

    # ---- generation ----------------------------------------------------------------------------------
    def _start_next(self) -> None:
        if self.running is not None or not self.queue:
            return
        import numpy as np
        import openvino as ov

        pending = self.queue.popleft()
        running = Running(pending, _streamer_class()(self._wake))
        inputs = ov.Tensor(np.asarray([pending.ids], dtype=np.int64)) if not self.spec.vision else None
        running.thread = threading.Thread(target=self._generate, args=(running, inputs), daemon=True,
                                          name=f"generate-{pending.job}")
        self.running = running
        running.thread.start()

    def _generate(self, running: Running, inputs: Any) -> None:
        try:
            pending = running.pending
            if self.spec.vision:
                images = [image_tensor(b) for b in pending.images]
                running.result = self.pipe.generate(pending.prompt, images=images, generation_config=pending.config,
                                                    streamer=running.streamer)
            else:
                running.result = self.pipe.generate(inputs, pending.config, running.streamer)
        except BaseException as exc:  # reported by the main loop, which owns the pipe
            running.error = exc
        finally:
            running.done = True
            self._wake()

    def collect(self, out: Updates) -> None:
        """Forward new ids of the running job; finish it once its thread is done, then start the next.

        A trailing end-of-sequence id is held back: if generation ends there it is not text, only counted.
        """
        self._drain_wakes()
        running = self.running
        if running is None:
            return
        done = running.done  # read before taking: every write happens before `done` is set
        ids = running.streamer.take()
        if not running.answered:
            running.sent.extend(ids)
        if not done:
            ids = self._hold_end(running, ids)
            if ids and not running.answered:
                out.append(protocol.running(running.job, ids))
            return
        running.thread.join()
        self.running = None
        if not running.answered:
            out.append(self._final_update(running, running.held + ids))
        self._start_next()

    def _hold_end(self, running: Running, ids: list[int]) -> list[int]:
        ids = running.held + ids
        running.held = [ids.pop()] if ids and ids[-1] in running.pending.ends else []
        return ids

    def _final_update(self, running: Running, ids: list[int]) -> list[Any]:
        job = running.job
        if running.error is not None:
            log.error("generation of %s failed: %s", job, running.error)
            message = f"generation failed: {error_message(running.error)}"
            return protocol.error(job, {"status": 500, "message": message}, ids)
        tail = self._unstreamed(running)
        running.sent.extend(tail)
        ids = ids + tail
        ends = running.pending.ends
        if ids and ids[-1] in ends:  # it ended on an end-of-sequence id: a "stop", that id counted, not sent
            return protocol.ended(job, ids[:-1], protocol.STOP, protocol.ENDED_ON_EOS)
        reasons = list(running.result.finish_reasons)
        reached = reasons and reasons[0] == self._g.GenerationFinishReason.LENGTH
        generated = len([i for i in running.sent if i not in ends])
        finish = protocol.LENGTH if reached or generated >= running.pending.budget else protocol.STOP
        return protocol.ended(job, ids, finish)

    def _unstreamed(self, running: Running) -> list[int]:
        """Ids in the result the streamer never saw, so that usage counts what was generated."""
        if not hasattr(running.result, "tokens"):  # VLMPipeline returns text only: the streamer saw every id
            return []
        tokens = list(running.result.tokens[0]) if running.result.tokens else []
        sent = running.sent
        if tokens[: len(sent)] == sent:
            return tokens[len(sent):]
        log.warning("job %s: streamed %d ids that differ from the %d in the result", running.job, len(sent),
                    len(tokens))
        return []

    def close(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)


def _one_sequence(name: str) -> OvqError:
    return OvqError(f"this stateful servable generates one sequence per request: {name} must be 1 "
                    "(n, best_of and beam search are not supported)", param=name)


def _send(outputs: Connection, out: Updates) -> bool:
    try:
        send(outputs, out)
    except OSError:  # the I/O half has gone: nothing left to tell
        return False
    return True


def serve(commands: Connection, outputs: Connection, engine: StatefulEngine) -> None:
    """The main loop: wait for commands or new ids, answer with one message per wake-up."""
    while True:
        ready = wait([commands, engine.wake_fd])
        out: Updates = []
        if commands in ready:
            while commands.poll(0):
                try:
                    message = orjson.loads(commands.recv_bytes())
                except (EOFError, OSError):  # the I/O half died: stop generating for nobody
                    engine.stop(out)
                    return
                if not protocol.apply(engine, message, out):
                    _send(outputs, out)
                    return
        engine.collect(out)
        if out and not _send(outputs, out):
            engine.stop([])
            return


def run(commands: Connection, outputs: Connection, spec: EngineSpec) -> None:
    """Entry point of the engine process."""
    engine = handshake(outputs, lambda: StatefulEngine(spec))
    if engine is None:
        return
    try:
        serve(commands, outputs, engine)
    finally:
        engine.close()
