"""How many new jobs a continuous-batching worker takes from its stream now: what its engine can schedule.

Taking up to `max_num_seqs` jobs at once would empty the stream into one engine: the backlog would hide from the
autoscaler and from other workers (a new replica could not take what this one holds). So a worker takes jobs
only while its engine has room to start them: nothing it could not schedule in its last step, the prompt
tokens still waiting for prefill under one step's budget (`max_num_batched_tokens`), and, with a fixed KV cache,
the cache not nearly full.

A step's stats reach this process after the engine has begun its next step, so a burst bigger than one step's
budget is prefilled a budget at a time with a step of decoding between (16 streams at once: 5 prompts, a 21 ms
step without prompts, the next 6). Letting two steps' worth wait in the engine removed those steps but made
TTFT p50 worse by about 1.5x at 16 and 64 closed-loop streams of SmolLM2 (p95 a little better, throughput the
same), so one step's worth it stays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# With a fixed KV cache (cache_size > 0): take nothing new above this usage (%). A cache that grows as needed
# (cache_size 0) always reports itself full, so usage says nothing there.
CACHE_HIGH = 95.0


@dataclass
class Admission:
    max_seqs: int
    step_tokens: int  # max_num_batched_tokens: the prompt tokens one step can prefill
    fixed_cache: bool
    chars_per_token: float = 4.0  # learned from accepted prompts: estimates jobs the engine has not counted yet
    average_prompt: float = 64.0  # prompt tokens per job, an exponential average
    stats: list[float] | None = None  # the engine's last [requests, scheduled, cache %, prompt tokens waiting]
    uncounted: dict[str, int] = field(default_factory=dict)  # sent jobs the last stats do not include yet
    accepted: set[str] = field(default_factory=set)

    def room(self, running: int) -> int:
        free_seqs = self.max_seqs - running
        if free_seqs <= 0:
            return 0
        waiting = sum(self.uncounted.values())
        if self.stats is not None and running:
            requests, scheduled, cache, prefill = self.stats
            if requests > scheduled or (self.fixed_cache and cache >= CACHE_HIGH):
                return 0
            waiting += int(prefill)
        free_tokens = self.step_tokens - waiting
        if free_tokens <= 0:
            return 0 if waiting else 1  # one prompt longer than a step is still taken when nothing waits
        return min(free_seqs, max(1, math.ceil(free_tokens / self.average_prompt)))

    def sent(self, job: str, prompt: str | list[int]) -> None:
        size = len(prompt) if isinstance(prompt, list) else int(len(prompt) / self.chars_per_token)
        self.uncounted[job] = max(1, size)

    def answered(self, job: str, prompt: str | list[int], tokens: int | None) -> None:
        """The engine accepted the job (`tokens` of prompt) or refused it (None)."""
        if job not in self.uncounted:
            return
        self.accepted.add(job)
        if tokens:
            self.uncounted[job] = tokens
            self.average_prompt = 0.9 * self.average_prompt + 0.1 * tokens
            if isinstance(prompt, str) and prompt:
                self.chars_per_token = 0.9 * self.chars_per_token + 0.1 * (len(prompt) / tokens)
        else:
            self.uncounted[job] = 0

    def stepped(self, stats: list[float]) -> None:
        """A step's stats count every job accepted before them: those need no estimate any more."""
        self.stats = stats
        for job in self.accepted:
            self.uncounted.pop(job, None)
        self.accepted.clear()

    def forget(self, job: str) -> None:
        self.uncounted.pop(job, None)
        self.accepted.discard(job)

    def idle(self) -> None:
        """No job runs: whatever the last stats said is over."""
        self.stats = None
        self.uncounted.clear()
        self.accepted.clear()
