"""What the I/O half knows about one running job: its text so far, its event sequence, its timings."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from common.events import Delta, Done, Timings, Usage
from common.jobs import Job
from workers.detokenizer import StopFilter, Stream


@dataclass
class RunningJob:
    job: Job
    entry_id: bytes
    detok: Stream
    prompt_tokens: int = 0
    received: float = field(default_factory=time.time)
    first_token: float | None = None
    seq: int = 0
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    stops: StopFilter = field(init=False)

    def __post_init__(self) -> None:
        self.stops = StopFilter(self.job.params.stop)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @property
    def streamed(self) -> bool:
        return bool(self.text)

    def delta(self, ids: list[int], text: str) -> Delta | None:
        """Account for new tokens and their text; a Delta when some of it may reach the client."""
        if ids and self.first_token is None:
            self.first_token = time.time()
        self.completion_tokens += len(ids)
        return self._emit(self.stops.feed(text), len(ids))

    def flush(self) -> Delta | None:
        return self._emit(self.stops.flush(), 0)

    def _emit(self, text: str, tokens: int) -> Delta | None:
        if not text:
            return None
        self.text.append(text)
        return Delta(job=self.job.id, seq=self.next_seq(), text=text, tokens=tokens)

    def done(self, finish_reason: str) -> Done:
        now = time.time()
        queue_ms = (self.received - self.job.created) * 1000
        ttft = (self.first_token - self.job.created) * 1000 if self.first_token else None
        return Done(
            job=self.job.id,
            seq=self.next_seq(),
            finish_reason="length" if finish_reason == "length" else "stop",
            usage=Usage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                total_tokens=self.prompt_tokens + self.completion_tokens,
            ),
            timings=Timings(queue_ms=queue_ms, ttft_ms=ttft, total_ms=(now - self.job.created) * 1000),
        )
