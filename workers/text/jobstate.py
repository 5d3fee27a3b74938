"""What the I/O half knows about one running job: each choice's text so far, the event sequence, the timings.

A choice's new text goes out at most once per stream interval (`stream_interval_ms`): text that comes sooner is
held and sent with the next delta due, so a fast engine sends (and the API relays) a few tokens per event
instead of one event per token per step. Its first text and its end never wait; `due()` sends what a choice
holds once its interval has passed, whether or not this step gave it tokens.

With `record` on (OVQ_WORKER_TAKEOVER), each delta sent also notes the ids it sent the text of
(`workers/text/progress.py`) in `unrecorded`, for the worker to put in the same outbox: another worker can then
continue the job (`replay`) if this one dies.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from common.events import Done, Timings, Usage, delta
from common.jobs import Job
from workers.engine import protocol
from workers.text.detokenizer import StopFilter, Stream
from workers.text.logprobs import LogprobAligner
from workers.text.progress import end_record, ids_record


@dataclass
class Choice:
    index: int
    detok: Stream
    stops: StopFilter
    logprobs: LogprobAligner | None
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # generated so far: a restarted engine goes on from them
    tokens: int = 0
    emitted: int = 0  # characters sent (echo excluded): where the log-probabilities are released up to
    finish: str | None = None
    last_token: float | None = None  # when its latest tokens came (unix s): inter-token latency
    # Released by the stop filter but not sent yet (within the stream interval of its last delta).
    held: list[str] = field(default_factory=list)
    held_tokens: int = 0
    held_entries: list[dict[str, Any]] = field(default_factory=list)
    sent_at: float | None = None  # time.monotonic() of its last delta
    recorded: int = 0  # of `ids`, how many are in the job's record of generated ids
    logprob_values: list[float] = field(default_factory=list)  # of `ids`, when recorded with log-probabilities


@dataclass
class RunningJob:
    job: Job
    entry_id: bytes
    streams: list[Stream]  # one per choice
    prompt_tokens: int = 0
    received: float = field(default_factory=time.time)
    accepted: float | None = None  # when the engine took it (unix s)
    first_token: float | None = None
    seq: int = 0
    interval: float = 0.0  # seconds: the stream interval
    # Some text has gone to the client: the job can be handed to another worker only to continue it (`record`).
    streamed: bool = False
    record: bool = False  # keep a record of the ids sent (`unrecorded`), so another worker can continue the job
    unrecorded: list[bytes] = field(default_factory=list)  # records not yet in an outbox
    recorded_once: bool = False  # this worker has put a record in an outbox (the first sets its TTL)
    choices: list[Choice] = field(init=False)
    plain: bool = field(init=False)

    def __post_init__(self) -> None:
        params = self.job.params
        self.choices = [
            Choice(i, stream, StopFilter(params.stop, params.include_stop_str_in_output),
                   LogprobAligner() if params.logprobs is not None else None)
            for i, stream in enumerate(self.streams)
        ]
        # One choice, no stop strings, no log-probabilities, special tokens skipped: `more()` takes its tokens.
        first = self.choices[0]
        self.plain = len(self.choices) == 1 and not first.stops.stops and first.logprobs is None and first.detok.skip

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def take_record(self) -> tuple[list[bytes], bool] | None:
        """The records noted since the last call, and whether they are this worker's first, for the outbox."""
        if not self.unrecorded:
            return None
        records, self.unrecorded = self.unrecorded, []
        first, self.recorded_once = not self.recorded_once, True
        return records, first

    def _note(self, choice: Choice, seq: int) -> None:
        """Record the ids of the text just sent (all of the choice's ids not recorded yet)."""
        ids = choice.ids[choice.recorded:]
        logprobs = choice.logprob_values[choice.recorded:] if choice.logprobs is not None else None
        choice.recorded += len(ids)
        self.unrecorded.append(ids_record(choice.index, seq, ids, logprobs))

    def replay(self, choice: Choice, ids: list[int], text: str, entries: list[dict[str, Any]] | None) -> None:
        """Taken over from a dead worker: account for the ids it had sent the text of (`text`: what a new
        detokenizer makes of them), as if they had just been sent here, so the text goes on from where the client
        is; what the stop filter or the detokenizer held of them stays held."""
        self.delta(choice, ids, text, entries, time.monotonic())
        choice.held, choice.held_entries, choice.held_tokens = [], [], 0
        choice.recorded = len(choice.ids)
        self.unrecorded.clear()
        self.streamed = True

    def resume(self) -> dict[str, Any]:
        """What a restarted engine needs to continue this job: each choice's ids, the finished choices."""
        return protocol.resume({c.index: c.ids for c in self.choices if c.finish is None},
                               [c.index for c in self.choices if c.finish is not None])

    @property
    def finished(self) -> bool:
        return all(choice.finish is not None for choice in self.choices)

    def delta(self, choice: Choice, ids: list[int], text: str, entries: list[dict[str, Any]] | None,
              now: float | None = None) -> dict[str, Any] | None:
        """Account for new tokens and their text; a Delta when some of it (or its log-probabilities) may go out.
        `now`: time.monotonic() (one reading per engine step)."""
        if ids and self.first_token is None:
            self.first_token = time.time()
        choice.tokens += len(ids)
        choice.ids.extend(ids)
        if self.record and choice.logprobs is not None and entries:
            choice.logprob_values.extend(entry["logprob"] for entry in entries)
        if choice.logprobs is not None and entries:
            pieces = choice.detok.pieces
            if len(pieces) != len(entries):  # ids the detokenizer dropped (end of sequence): no text of their own
                pieces = [0] * (len(entries) - 1) + [sum(pieces)]
            choice.logprobs.add(pieces, entries)
        return self._emit(choice, choice.stops.feed(text), len(ids), now=now)

    def more(self, choice: Choice, ids: list[int], text: str, now: float) -> dict[str, Any] | None:
        """`delta()` for a plain job's next tokens (see `plain`), once its first tokens and text have gone out."""
        choice.tokens += len(ids)
        choice.ids.extend(ids)
        return self._emit(choice, text, len(ids), now=now)

    def echo(self, choice: Choice, text: str, entries: list[dict[str, Any]] | None) -> dict[str, Any]:
        choice.text.append(text)
        self.streamed = True
        seq = self.next_seq()
        if self.record:  # an empty record: a worker that continues the job does not echo again
            self.unrecorded.append(ids_record(choice.index, seq, [], [] if choice.logprobs is not None else None))
        return delta(self.job.id, seq, choice.index, text, 0, entries, echo=True)

    def finish(self, choice: Choice, reason: str, ended: bool = False) -> dict[str, Any]:
        """The choice's last delta: text held back for a stop string that never came, and its finish reason.
        `ended`: it ended on an end-of-sequence id, which has no text but counts as a token (OpenAI, vLLM)."""
        choice.finish = "length" if reason == "length" else "stop"
        choice.tokens += int(ended)
        last = self._emit(choice, choice.stops.flush(), int(ended), final=True)
        if last is None:  # tokens without text of their own (the end of sequence) still count
            last = delta(self.job.id, self.next_seq(), choice.index, "", choice.held_tokens)
            choice.held_tokens = 0
        last["finish_reason"] = choice.finish
        if self.record:
            self.unrecorded.append(end_record(choice.index, last["seq"], choice.finish, choice.tokens))
        return last

    def _emit(self, choice: Choice, text: str, tokens: int, final: bool = False,
              now: float | None = None) -> dict[str, Any] | None:
        choice.emitted += len(text)
        if choice.logprobs is not None:
            aligner = choice.logprobs
            entries = aligner.rest(choice.stops.stopped, choice.emitted) if final else aligner.release(choice.emitted)
            choice.held_entries.extend(entries or ())
        if text:
            choice.held.append(text)
        choice.held_tokens += tokens
        if now is None:
            now = time.monotonic()
        if not final and choice.sent_at is not None and now - choice.sent_at < self.interval:
            return None
        return self._send(choice, now)

    def _send(self, choice: Choice, now: float) -> dict[str, Any] | None:
        if not choice.held and not choice.held_entries:
            return None
        text, entries, tokens = "".join(choice.held), choice.held_entries, choice.held_tokens
        choice.held, choice.held_entries, choice.held_tokens = [], [], 0
        choice.sent_at = now
        if text:
            choice.text.append(text)
            self.streamed = True
        seq = self.next_seq()
        if self.record:
            self._note(choice, seq)
        return delta(self.job.id, seq, choice.index, text, tokens, entries or None)

    def due(self, now: float, everything: bool = False) -> list[dict[str, Any]]:
        """Deltas of held text whose stream interval has passed (of all held text: before an error ends it)."""
        out = []
        for choice in self.choices:
            if (choice.held or choice.held_entries) and (everything or now - (choice.sent_at or 0.0) >= self.interval):
                sent = self._send(choice, now)
                if sent is not None:
                    out.append(sent)
        return out

    def summary(self) -> dict[str, float | int | None]:
        """The counts and timings the job hash keeps (and the job log line shows), whatever the job's end."""
        now = time.time()
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": sum(c.tokens for c in self.choices),
                "queue_ms": round((self.received - self.job.created) * 1000, 1),
                "ttft_ms": round((self.first_token - self.job.created) * 1000, 1) if self.first_token else None,
                "total_ms": round((now - self.job.created) * 1000, 1)}

    def done(self) -> Done:
        now = time.time()
        queue_ms = (self.received - self.job.created) * 1000
        ttft = (self.first_token - self.job.created) * 1000 if self.first_token else None
        completion = sum(choice.tokens for choice in self.choices)
        reasons = [choice.finish or "stop" for choice in self.choices]
        return Done(
            job=self.job.id,
            seq=self.next_seq(),
            finish_reason=reasons[0],
            finish_reasons=reasons,
            usage=Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                        total_tokens=self.prompt_tokens + completion),
            timings=Timings(queue_ms=queue_ms, ttft_ms=ttft, total_ms=(now - self.job.created) * 1000),
        )
