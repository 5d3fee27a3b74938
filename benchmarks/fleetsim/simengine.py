"""A simulated engine, for benchmarks only: speaks the engine pipe (`workers/engine/protocol.py`) unchanged, sleeps
for each step as long as a profile of the real engine says, and emits token ids. Never used by a test to prove a
feature: it lets the real API, worker I/O halves, Redis and scheduler run at a fleet size this machine could never
hold with real engines (issue 40).

A step takes `a + b * running + c * prompt tokens scheduled` seconds (`Profile`); a job's prompt is prefilled in
chunks of `max_num_batched_tokens` shared by the jobs prefilling, as with dynamic split-fuse; it then makes one id
per step until its `max_tokens` (default 16). `max_num_seqs` bounds the jobs stepped at once (the rest wait, as
they would in GenAI's scheduler). Prefix cache, crudely: the first `PREFIX_BLOCK` multiples of a prompt's ids (or
characters) are remembered in an LRU of `prefix_blocks` blocks; a hit skips those prompt tokens.

Selected by `benchmarks/fleetsim/hollow.py` (the engine target it hands the text worker); `OVQ_SIM_PROFILE` names a
profile in `PROFILES` or gives one as JSON {"a": s, "b": s, "c": s, "prefix_blocks": n}.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import orjson

from workers.engine import protocol
from workers.engine.protocol import EngineSpec, Updates

PREFIX_BLOCK = 32  # tokens (GenAI's KV block on CPU)
TOKEN_ID = 42  # what every step emits: the I/O half's detokenizer needs a real id of the vocabulary


@dataclass(frozen=True)
class Profile:
    a: float  # s per step, fixed
    b: float  # s per running sequence
    c: float  # s per prompt token scheduled in the step
    prefix_blocks: int = 4096  # prefix cache size, in blocks of PREFIX_BLOCK tokens

    def step_s(self, running: int, prompt_tokens: int) -> float:
        return self.a + self.b * running + self.c * prompt_tokens


# SmolLM2-135M Q4_1 on 2 cores: a and b from /work/shared/bench/README.md's raw ContinuousBatchingPipeline step
# loop (81 tok/s at 1 stream = 12.3 ms/step, 489 at 16 = 32.7 ms, 658 at 64 = 97 ms: 1.35 ms per sequence); c from
# benchmarks/fleetsim/prefill.py on the same (heavily shared) machine: prefill steps of 256 and 1000 tokens took
# 2.42 s and 10.6 s against decode steps of about 130 ms, i.e. 11 ms per prompt token at 10.6x a published decode
# step: about 1.0 ms per prompt token unloaded (a ratio from one noisy run: +-30 %).
# 7B-class: Meta-Llama-3-8B-Instruct on OVMS 2024.5 (Xeon Gen4/5), demos/continuous_batching/README.md of
# openvinotoolkit/model_server: 2.23 req/s, 444 output tok/s, 924 total tok/s, median TPOT 224 ms at request rate
# inf, i.e. about 195 tokens (94 decode + 101 prompt) per 212 ms step: about 1 ms per token scheduled; a assumed.
PROFILES = {
    "smollm2": Profile(a=0.011, b=0.00135, c=0.0010),
    "llama3-8b-ovms": Profile(a=0.020, b=0.00098, c=0.00098),
    "instant": Profile(a=0.0, b=0.0, c=0.0),
}


def load_profile(value: str | None) -> Profile:
    if not value:
        return PROFILES["smollm2"]
    if value in PROFILES:
        return PROFILES[value]
    return Profile(**json.loads(value))


@dataclass
class Seq:
    job: str
    prompt: list[int] | str
    to_prefill: int
    budget: int
    made: int = 0


@dataclass
class SimEngine:
    """`protocol.Commands` with a step that sleeps."""

    spec: EngineSpec
    profile: Profile
    requests: dict[str, Seq] = field(default_factory=dict)
    prefixes: OrderedDict[Any, None] = field(default_factory=OrderedDict)
    hits: int = 0

    @property
    def max_seqs(self) -> int:
        return int(self.spec.scheduler.get("max_num_seqs") or 256)

    @property
    def batch_tokens(self) -> int:
        return int(self.spec.scheduler.get("max_num_batched_tokens") or 256)

    def add(self, job: str, prompt: str | list[int], add_special: bool, params: dict[str, Any], images: list[str],
            resume: dict[str, Any] | None, out: Updates, kind: str = "chat") -> None:
        tokens = len(prompt) if isinstance(prompt, list) else max(1, len(prompt) // 4)
        budget = int(params.get("max_tokens") or 16)
        if resume is not None:
            generated, _ = protocol.resumed(resume)
            budget = max(1, budget - len(generated.get(0, [])))
        self.requests[job] = Seq(job, prompt, tokens - self._cached(prompt, tokens), budget)
        out.append(protocol.accepted(job, tokens))

    def _cached(self, prompt: str | list[int], tokens: int) -> int:
        """Prompt tokens a prefix-cache hit skips; the prompt's blocks go into the LRU."""
        chars = 1 if isinstance(prompt, list) else 4
        hit = 0
        for end in range(PREFIX_BLOCK, tokens + 1, PREFIX_BLOCK):
            key = hash(tuple(prompt[:end]) if isinstance(prompt, list) else prompt[:end * chars])
            if key in self.prefixes:
                self.prefixes.move_to_end(key)
                hit = end
            else:
                self.prefixes[key] = None
        while len(self.prefixes) > self.profile.prefix_blocks:
            self.prefixes.popitem(last=False)
        self.hits += hit > 0
        return min(hit, tokens - 1)

    def cancel(self, job: str, out: Updates, index: int | None = None) -> None:
        if self.requests.pop(job, None) is not None and index is None:
            out.append(protocol.cancelled(job, []))

    def stop(self, out: Updates) -> None:
        for job in list(self.requests):
            self.cancel(job, out)

    def stats(self) -> list[Any]:
        running = list(self.requests.values())[: self.max_seqs]
        waiting = sum(s.to_prefill for s in self.requests.values())
        return [len(self.requests), len(running), min(100.0, 100.0 * len(self.requests) / self.max_seqs), waiting]

    def step(self, out: Updates) -> None:
        """Schedule up to max_num_seqs: the prefilling share the token budget, the others make one id; sleep."""
        scheduled = list(self.requests.values())[: self.max_seqs]
        budget, prompt = self.batch_tokens, 0
        for seq in scheduled:
            if seq.to_prefill:
                chunk = min(seq.to_prefill, budget)
                seq.to_prefill -= chunk
                budget -= chunk
                prompt += chunk
        time.sleep(self.profile.step_s(len(scheduled), prompt))
        for seq in scheduled:
            if seq.to_prefill:
                continue
            seq.made += 1
            if seq.made >= seq.budget:
                del self.requests[seq.job]
                out.append(protocol.ended(seq.job, [TOKEN_ID], protocol.LENGTH))
            else:
                out.append(protocol.running(seq.job, [TOKEN_ID]))


def _take(commands: Connection, outputs: Connection, engine: SimEngine, out: Updates) -> bool:
    """Every command waiting (block while idle); False on "stop" or EOF."""
    timeout = 0.0 if engine.requests else None
    while commands.poll(timeout):
        try:
            message = orjson.loads(commands.recv_bytes())
        except EOFError:
            return False
        if not protocol.apply(engine, message, out):
            outputs.send_bytes(orjson.dumps(protocol.report(out)))
            return False
        timeout = 0.0
    return True


def run(commands: Connection, outputs: Connection, spec: EngineSpec) -> None:
    """The engine target: the same loop shape as `workers.engine.continuous.run`."""
    try:  # its own process: the I/O half decides when it stops
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # a thread of the host process (benchmarks/fleetsim/hollow.py): signals are the host's
        pass
    engine = SimEngine(spec, load_profile(os.environ.get("OVQ_SIM_PROFILE")))
    outputs.send_bytes(orjson.dumps(protocol.ready()))
    busy = True
    while True:
        if busy and not engine.requests:
            outputs.send_bytes(orjson.dumps(protocol.idle(engine.stats())))
            busy = False
        out: Updates = []
        if not _take(commands, outputs, engine, out):
            return
        if out:
            outputs.send_bytes(orjson.dumps(protocol.report(out)))
            out = []
        if not engine.requests:
            continue
        busy = True
        engine.step(out)
        outputs.send_bytes(orjson.dumps(protocol.report(out, engine.stats())))
