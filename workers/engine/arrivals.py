"""How long the engine waits, after a step that ended jobs, for the jobs that replace them.

A client that sends its next request when one ends (an agent's loop, an evaluation harness, any fixed pool of
concurrent requests) gets it to the engine a few milliseconds after the step that ended the last one: through
the API, the queue and the I/O half. By then the engine has begun its next step, and the new job waits for it
to end: a whole decode step on its time to first token, which an in-process step loop never pays. Measured at
16 closed-loop streams of SmolLM2 (benchmarks/serving.py): TTFT p50 1.17-1.22x raw without a window,
0.89-1.06x with the default one, throughput the same within noise.

So after a step that ended jobs, the engine waits up to `arrival_window_ms` for as many new ones, and steps as
soon as they are in. The running jobs pay that wait, so it is rationed: each step earns a small share of its
own time (`SHARE`) and a wait spends it. The engine never spends more than that share of its time waiting,
whatever the traffic; where jobs end on nearly every step (large batches), it waits only now and then.
"""
from __future__ import annotations

from dataclasses import dataclass

SHARE = 0.02  # of the engine's step time, at most, spent waiting for arrivals


@dataclass
class ArrivalWindow:
    seconds: float  # the longest wait; 0: never wait
    allowance: float = 0.0  # seconds of waiting earned and not yet spent

    def earn(self, step_s: float) -> None:
        self.allowance = min(self.allowance + step_s * SHARE, 2 * self.seconds)

    def wait(self, ended: int) -> float:
        """How long to wait now, after a step that ended `ended` jobs."""
        return self.seconds if ended and self.allowance >= self.seconds else 0.0  # 0 s: 0

    def spend(self, waited_s: float) -> None:
        self.allowance = max(0.0, self.allowance - waited_s)
