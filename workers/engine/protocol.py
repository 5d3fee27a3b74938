"""The engine pipe: what a worker's I/O half and its engine process say to each other, named once.

Two one-way pipes, one frame of JSON per message (`workers.engine.pipe` frames it on the I/O side, blocking
`multiprocessing.Connection`s on the engine side):

  in  (a list of commands): `add_command`, `cancel_command`, `stop_command` build them; `apply` reads a message
      and calls the engine's `add` / `cancel` / `stop` (`Commands`).
      ["add", job, prompt, add_special_tokens, sampling params, images, resume, kind]
          images: base64 image files for vision-language models, in prompt order
          resume: null, or {"generated": {index: [ids]}, "done": [index, ...]}: the job ran on an engine that
          failed, or on a worker that died (its I/O half replays what that one recorded); each unfinished choice
          goes on from its generated ids (prompt + ids, budget less them)
          kind: the job's ("chat" or "completion"), which names the field a refusal of the prompt points at;
          resume and kind may be left off (null, "chat").
      ["cancel", job] | ["cancel", job, index] (the I/O half ended choice `index` itself: drop it, no answer)
      ["stop"]
  out (an object):
      {"u": [update, ...], "s": stats or null} (`report`)
          update, short: [job, ids, state, extra]; full: [job, ids, state, extra, index, logprobs].
          state: None while running, else "accepted" (extra: prompt tokens) | "stop" (extra: 1 when the choice
          ended on an end-of-sequence id, which is counted but never sent, else null) | "length" | "cancelled"
          | "error" (extra: {status, message, param, code}) | "prompt" (echo: the prompt's ids). `index`
          (choice, default 0) and `logprobs` (one per id, or None) are left off in the short form.
          The usual update, more tokens of choice 0 without log-probabilities, is `[job, ids, None, None]`
          (`running`): the I/O half takes it on its fast path (`is_running`), reading it in place.
          stats, after each step: [requests, scheduled requests, KV cache usage %, prompt tokens not yet
          prefilled]: what the I/O half admits new jobs by.
      {"idle": stats} (`idle`): the engine ran its last job (finished or cancelled) and has freed what the jobs
          held (one empty step): its stats as it idles, so a KV-cache usage above 0 there is a leak, not a
          figure left over from the last busy step. Not a step: admission learns nothing from it.
      {"broken": message, "suspects": [job, ...]} (`broken`): a step failed; the pipeline refuses every later
          call, so the process exits after this. Suspects are the jobs added since the last step that succeeded.
      the first frame: {"ready": true} | {"ready": false, "error": message} (`ready`)

No protocol version travels on the pipe, and none is needed: the engine process is spawned by its I/O half
(multiprocessing "spawn", same interpreter and sys.path, at worker start and at each engine restart), so both
ends run the code of one installed package.

Updates are made and read per job and engine step, so they stay plain lists (no model to build or validate per
token): builders, positions and `full` (either form, to unpack by name) here. On a replay of recorded engine
output (32 jobs, 4608 tokens, about 45 % of the updates off the fast path), reading those updates into a NamedTuple
made the worker's `_on_message` 5-10 % slower; unpacking `full(update)` measured level with the positional reads
it replaced.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

log = logging.getLogger("ovq.engine")


@dataclass
class EngineSpec:
    """What the engine process is started with (pickled to it once; not a pipe message)."""

    path: str
    device: str
    scheduler: dict[str, Any]
    plugin_config: dict[str, Any]
    context_length: int
    cache_eviction: dict[str, Any] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None
    vision: bool = False  # a vision-language model directory: prompts come with images
    end_ids: list[int] = field(default_factory=list)  # end-of-sequence ids: never text, never counted
    arrival_window_ms: float = 0.0  # see workers/engine/arrivals.py
    # Speculative decoding: {"path", "device", "scheduler"} of the draft model, or None.
    draft: dict[str, Any] | None = None
    # LoRA adapters a job may name: {name: {"path": safetensors file, "alpha": float}}.
    adapters: dict[str, dict[str, Any]] = field(default_factory=dict)


# ---- commands (I/O half -> engine) -------------------------------------------------------------------------
ADD, CANCEL, STOP_ENGINE = "add", "cancel", "stop"


class Add(NamedTuple):
    job: str
    prompt: str | list[int]
    add_special_tokens: bool
    params: dict[str, Any]
    images: list[str]
    resume: dict[str, Any] | None = None
    kind: str = "chat"


def add_command(job: str, prompt: str | list[int], add_special_tokens: bool, params: dict[str, Any],
                images: list[str], resume: dict[str, Any] | None, kind: str) -> list[Any]:
    return [ADD, job, prompt, add_special_tokens, params, images, resume, kind]


def resume(generated: dict[int, list[int]], done: list[int]) -> dict[str, Any]:
    """An add's `resume`: each unfinished choice's generated ids (JSON keys are strings), the finished choices."""
    return {"generated": {str(index): ids for index, ids in generated.items()}, "done": done}


def resumed(resume: dict[str, Any]) -> tuple[dict[int, list[int]], set[int]]:
    """`resume` read back: generated ids by choice, finished choices."""
    generated = {int(index): list(ids) for index, ids in resume.get("generated", {}).items()}
    return generated, set(resume.get("done", []))


def cancel_command(job: str, index: int | None = None) -> list[Any]:
    """Cancel a job (the engine answers `cancelled`), or drop choice `index` the I/O half has ended (no answer)."""
    return [CANCEL, job] if index is None else [CANCEL, job, index]


def stop_command() -> list[Any]:
    return [STOP_ENGINE]


Updates = list[list[Any]]


class Commands(Protocol):
    """What an engine does with the commands (`continuous.Engine`, `stateful.StatefulEngine`)."""

    def add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any], images: list[str],
            resume: dict[str, Any] | None, out: Updates, kind: str = "chat") -> None: ...

    def cancel(self, job: str, out: Updates, index: int | None = None) -> None: ...

    def stop(self, out: Updates) -> None: ...


def apply(engine: Commands, commands: list[list[Any]], out: Updates) -> bool:
    """One message's commands, in order, answers into `out`; False on "stop" (the commands after it are not run).
    An unknown command is a bug of this package (both ends are one version): logged and skipped."""
    for command in commands:
        name = command[0]
        if name == ADD:
            a = Add(*command[1:])
            engine.add(a.job, a.prompt, a.add_special_tokens, a.params, a.images, a.resume, out, a.kind)
        elif name == CANCEL:
            engine.cancel(command[1], out, command[2] if len(command) > 2 else None)
        elif name == STOP_ENGINE:
            engine.stop(out)
            return False
        else:
            log.error("unknown engine command %r: skipped", name)
    return True


def added(commands: list[list[Any]]) -> int:
    """How many jobs a message adds."""
    return sum(1 for command in commands if command[0] == ADD)


# ---- updates (engine -> I/O half) --------------------------------------------------------------------------
# Positions in an update; the short form ends at EXTRA.
JOB, IDS, STATE, EXTRA, INDEX, LOGPROBS = range(6)
SHORT, FULL = 4, 6
_SHORT_TAIL = [0, None]  # what the short form leaves off: index, logprobs
# States (None: running).
ACCEPTED, STOP, LENGTH, CANCELLED, ERROR, PROMPT = "accepted", "stop", "length", "cancelled", "error", "prompt"
ENDED_ON_EOS = 1  # a "stop"'s extra: the choice ended on an end-of-sequence id (counted in usage, not sent)
GENERATED = (None, STOP, LENGTH)  # states whose ids are generated text


def full(update: list[Any]) -> list[Any]:
    """Either form as the full one, to unpack: `job, ids, state, extra, index, logprobs = full(update)` (the
    short form's index is 0, its logprobs None). A list, not a model: the worker reads every update that its fast
    path does not take this way, per step."""
    return update if len(update) == FULL else update + _SHORT_TAIL


def is_running(update: list[Any]) -> bool:
    """The short running form, `running(job, ids)`. The worker's fast path inlines this test: calling it there
    made `_on_message` about 4 % slower on the replay."""
    return len(update) == SHORT and update[STATE] is None


def running(job: str, ids: list[int]) -> list[Any]:
    """More tokens of choice 0, without log-probabilities: the usual update, short."""
    return [job, ids, None, None]


def update(job: str, ids: list[int], state: str | None, extra: Any, index: int,
           logprobs: list[float] | None) -> list[Any]:
    """The full form: a choice other than 0, log-probabilities, an echo or a choice's end."""
    return [job, ids, state, extra, index, logprobs]


def ended(job: str, ids: list[int], state: str, extra: Any = None) -> list[Any]:
    """A job's end in the short form (choice 0): its last ids and "stop" | "length" | "cancelled" | "error"."""
    return [job, ids, state, extra]


def accepted(job: str, prompt_tokens: int) -> list[Any]:
    return [job, [], ACCEPTED, prompt_tokens]


def cancelled(job: str, ids: list[int]) -> list[Any]:
    return [job, ids, CANCELLED, None]


def error(job: str, extra: dict[str, Any], ids: list[int] | None = None) -> list[Any]:
    """extra: {"status": HTTP status, "message", and optionally "type", "param", "code"}."""
    return [job, ids if ids is not None else [], ERROR, extra]


# ---- messages (engine -> I/O half) -------------------------------------------------------------------------
UPDATES, STATS, IDLE, BROKEN, SUSPECTS, READY, WHY = "u", "s", "idle", "broken", "suspects", "ready", "error"


def report(updates: Updates, stats: list[Any] | None = None) -> dict[str, Any]:
    return {UPDATES: updates, STATS: stats}


def idle(stats: list[Any]) -> dict[str, Any]:
    return {IDLE: stats}


def broken(message: str, suspects: list[str]) -> dict[str, Any]:
    return {BROKEN: message, SUSPECTS: suspects}


def ready(error: str | None = None) -> dict[str, Any]:
    """The handshake: ready, or why not."""
    return {READY: True} if error is None else {READY: False, WHY: error}
