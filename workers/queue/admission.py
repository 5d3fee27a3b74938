"""How many new jobs a continuous-batching worker takes from its stream now: what its engine can schedule, up to
the knee of its own throughput curve.

Taking up to `max_num_seqs` jobs at once would empty the stream into one engine: the backlog would hide from the
autoscaler and from other workers (a new replica could not take what this one holds). So a worker takes jobs
only while its engine has room to start them: nothing it could not schedule in its last step, the prompt
tokens still waiting for prefill under one step's budget (`max_num_batched_tokens`), and, with a fixed KV cache,
the cache not nearly full. A prompt longer than a step counts only what it has left (the engine follows the
split-fuse scheduler's order), so the next job comes in time to fill the step that finishes it: counted whole,
a burst of 16 prompts of 286 tokens was taken one per two steps, about 0.45 s apart.

A step's stats reach this process after the engine has begun its next step, so a burst bigger than one step's
budget is prefilled a budget at a time with a step of decoding between (16 streams at once: 5 prompts, a 21 ms
step without prompts, the next 6). Letting two steps' worth wait in the engine removed those steps but made
TTFT p50 worse by about 1.5x at 16 and 64 closed-loop streams of SmolLM2 (p95 a little better, throughput the
same), so one step's worth it stays.

The knee. Room to schedule is not a reason to take a job: on a CPU a step of 120 sequences takes about 5x one of
16 (SmolLM2 on 2 cores), for about 1.4x the tokens/s, and the jobs it holds can go to no other worker. So the
worker also stops at the knee of its own throughput curve, learned online (`Knee`): each decode-only step (no
prompt waiting, no job sent or ended in it or the step before, so its time is the decode of its sequences alone)
gives its time t against the tokens it generated n, averaged per n; a weighted least-squares line
t(n) = a + b n through those averages (a: the weights read once per step, b: each sequence's own work) gives
tokens/s T(n) = n / (a + b n), rising to 1 / b. The knee is the smallest n where one more sequence adds less than
`GAIN_FRACTION` (1 %) of the single-sequence rate: dT/dn = a / (a + b n)^2 < f / (a + b), so
n = (sqrt(a (a + b) / f) - a) / b. There T(n) is 1 - sqrt(f a / (a + b)), about 90 %, of the asymptote; on
SmolLM2 on 2 cores (a 11 ms, b 1.3 ms) that is about 79 sequences. 2 % gave 53 (97 % of the tokens/s of 64 by the
line), but noisy step times drag a fit's knee down (the unit test's noise, 40 seeds: median 69 for 79, 42 for
53) and a busy machine measured 7-10 % less than greedy at 64 streams; at 1 % the knee sits above 64 there, so
64 streams run as greedily as before and a 120-stream burst still leaves about 40 for another worker.
A fraction instead of a fixed share of the asymptote keeps the definition local (it needs the curve only near
where the worker runs) and scale-free (any model, any device). The model's `target_itl_ms` caps it further: the
most sequences whose fitted step time a + b n stays under it (unset: the knee alone).

Exploration: the limit is at most twice the largest n measured (`MEASURED` decode steps there; never under
`floor`), so a burst climbs to the knee over a few steps instead of trusting an extrapolation; a worker held at its
limit for `PROBE_EVERY` decode steps goes `limit / 4` (4 at least) above it for `PROBE_STEPS` steps, so an estimate
that came out low can rise. Each n's average is exponential and counts less in the fit the longer it goes
unmeasured (half after `HALF_LIFE` decode steps; afresh when measured again), so the curve follows a machine whose
load changes, yet a worker held at its knee keeps the points below it for a while. A fit without a positive
intercept (every step costs something of its own) is noise and is not used. The floor (16 sequences, or
`max_num_seqs` if lower) keeps a lone worker near full throughput whatever a noisy fit says, and bounds what
`target_itl_ms` can take away (a target the device cannot meet would otherwise run one sequence at a time).
Until a fit exists, nothing caps the ITL.

`greedy` (setting `OVQ_ADMISSION=greedy`) turns the knee off: the engine's room alone, as before, for comparison.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# With a fixed KV cache (cache_size > 0): take nothing new above this usage (%). A cache that grows as needed
# (cache_size 0) always reports itself full, so usage says nothing there.
CACHE_HIGH = 95.0
GAIN_FRACTION = 0.01  # the knee: one more sequence adds less than this share of the single-sequence tokens/s
FLOOR = 16  # the knee never goes below this many sequences (nor above max_num_seqs)
PROBE_EVERY = 64  # decode steps held at the limit before a probe above it
PROBE_STEPS = 8  # decode steps measured above the limit that end a probe
AVERAGE = 0.1  # weight of a new step time in its n's average
MEASURED = 4  # decode steps at one n before its average counts
FULL_WEIGHT = 8  # steps at one n after which its average counts fully in the fit
HALF_LIFE = 512  # decode steps after which an average not measured again counts half in the fit
# Once there is a line, it is fitted again every this many decode steps (until then, every step): a fit over ~50
# averages took ~130 µs, a few µs a token when done every step, and one step moves no average far.
REFIT_EVERY = 8


@dataclass
class Curve:
    """One n's step time: an exponential average and how many steps made it."""

    seconds: float
    steps: int = 1
    last: int = 0  # the decode step that measured it last


@dataclass
class Knee:
    """Step time against tokens per step, learned online; the most sequences worth running (module docstring)."""

    ceiling: int  # max_num_seqs
    target_itl_s: float | None = None
    fraction: float = GAIN_FRACTION
    floor: int = FLOOR
    curve: dict[int, Curve] = field(default_factory=dict)
    largest: int = 0  # the most tokens decode steps have made, MEASURED times at least
    fit: tuple[float, float] | None = None  # (a, b) of t(n) = a + b n, seconds
    held: int = 0  # decode steps at the limit since the last probe
    probing: bool = False
    observed: int = 0  # decode steps seen
    probed: int = 0  # decode steps above the limit in this probe

    def observe(self, tokens: int, seconds: float) -> None:
        """A decode-only step: `tokens` generated in `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        base = self._base()
        self.observed += 1
        point = self.curve.get(tokens)
        if point is None or self.observed - point.last > HALF_LIFE:  # new, or too old to average with
            self.curve[tokens] = Curve(seconds, last=self.observed)
        else:
            point.seconds += AVERAGE * (seconds - point.seconds)
            point.steps += 1
            point.last = self.observed
        if self.curve[tokens].steps >= MEASURED:
            self.largest = max(self.largest, tokens)
        if self.probing:
            self.held += 1
            self.probed += tokens > base
            if self.probed >= PROBE_STEPS or self.held >= PROBE_EVERY:  # measured above, or nothing came to probe
                self.probing, self.held, self.probed = False, 0, 0
        elif tokens >= base:
            self.held += 1
            if self.held >= PROBE_EVERY:
                self.probing, self.held = True, 0
        if self.fit is None or self.observed % REFIT_EVERY == 0:
            self.fit = self._fit() or self.fit

    def _fit(self) -> tuple[float, float] | None:
        """Weighted least squares through the averages, the older the lighter (the machine's load changes); None
        until two of them stand far enough apart. One pass over the averages (it runs every few steps)."""
        observed = self.observed
        w = wn = wt = wnn = wnt = 0.0
        low, high, count = self.ceiling + 1, 0, 0
        for n, c in self.curve.items():
            if c.steps < MEASURED:
                continue
            weight = min(c.steps, FULL_WEIGHT) * 0.5 ** ((observed - c.last) / HALF_LIFE)
            if weight < 0.5:
                continue
            count += 1
            low, high = min(low, n), max(high, n)
            t = c.seconds
            w += weight
            wn += weight * n
            wt += weight * t
            wnn += weight * n * n
            wnt += weight * n * t
        if count < 2 or high - low < max(2, low // 4):
            return None
        mean_n, mean_t = wn / w, wt / w
        b = (wnt - wn * mean_t) / (wnn - wn * mean_n)  # covariance over variance, from the sums
        a = mean_t - b * mean_n
        return (a, b) if a > 0 else None  # every step has a cost of its own: a line without one is noise

    def knee(self) -> int:
        """The knee of the fitted curve, within [floor, ceiling]; the ceiling while nothing says the curve bends."""
        floor = min(self.floor, self.ceiling)
        if self.fit is None:
            return self.ceiling
        a, b = self.fit
        if b <= 0:  # flat where measured: more sequences cost nothing yet
            return self.ceiling
        n = (math.sqrt(a * (a + b) / self.fraction) - a) / b
        return max(floor, min(self.ceiling, math.ceil(n)))

    def itl_cap(self) -> int:
        """The most sequences whose fitted step time stays within the target; the ceiling without one."""
        if self.target_itl_s is None or self.fit is None:
            return self.ceiling
        a, b = self.fit
        if b <= 0:  # flat where measured: more sequences do not slow a step, fewer would not speed it
            return self.ceiling if a <= self.target_itl_s else 0
        return max(0, min(self.ceiling, math.floor((self.target_itl_s - a) / b)))

    def _base(self) -> int:
        """The knee and no more than twice what was measured."""
        return min(self.knee(), max(min(self.floor, self.ceiling), 2 * self.largest))

    def limit(self) -> int:
        """Sequences to run at most now: the knee (a little above while probing) within the ITL cap, never under
        the floor."""
        limit = self._base()
        if self.probing:
            limit += max(4, limit // 4)
        return max(min(self.floor, self.ceiling), min(limit, self.ceiling, self.itl_cap()))


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
    knee: Knee | None = None  # None: greedy, the engine's room alone
    last_report: float | None = None  # when the last step's stats came (monotonic seconds)
    stirred: bool = False  # a job was sent or ended since the last stats
    calm: int = 0  # stats in a row with nothing stirred, nothing prefilling, nothing unscheduled

    def room(self, running: int) -> int:
        cap = self.max_seqs if self.knee is None else min(self.max_seqs, self.knee.limit())
        free_seqs = cap - running
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
        self.stirred = True
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

    def stepped(self, stats: list[float], tokens: int = 0, now: float | None = None) -> None:
        """A step's stats count every job accepted before them: those need no estimate any more. `tokens`: what the
        step generated; `now`: when its stats came. A decode-only step teaches the knee its time."""
        requests, scheduled, _, prefill = stats
        quiet = not self.stirred and not prefill and requests <= scheduled
        if (quiet and self.calm and self.knee is not None and now is not None and self.last_report is not None):
            self.knee.observe(tokens, now - self.last_report)
        self.calm = self.calm + 1 if quiet else 0
        self.stirred, self.last_report = False, now
        self.stats = stats
        for job in self.accepted:
            self.uncounted.pop(job, None)
        self.accepted.clear()

    def forget(self, job: str) -> None:
        self.stirred = True  # the engine may wait for arrivals after the step that ended it (arrival_window_ms)
        self.uncounted.pop(job, None)
        self.accepted.discard(job)

    def idle(self) -> None:
        """No job runs: whatever the last stats said is over."""
        self.stats = None
        self.uncounted.clear()
        self.accepted.clear()
        self.last_report, self.calm = None, 0
