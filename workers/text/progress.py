"""What a streamed text job has generated, kept in Redis while it streams (`Keys.generated`), so that another worker
can continue it when its own dies: `workers/queue/reclaim.py` claims the job, `TextWorker` replays these ids and
hands them to its engine as the add's `resume`.

A worker appends a record each time it sends a choice's text: the ids generated since that choice's last record.
So the ids recorded are always exactly those the client has had the text of: what the detokenizer (a split
character) or the stop filter (a tail that may become a stop string) still held of them when it was sent is held
again when the ids are replayed. Records go out in the publisher's round trip, just before the events they match.

A record is little-endian int32s: a header (choice, seq, n) then n ids, then (only for jobs that asked for
log-probabilities) n float64s. n < 0 ends the choice (-1 stop, -2 length): one int32 follows, its token count.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import lru_cache

_HEADER = struct.Struct("<iii")
_ONE = struct.Struct("<iiii")  # the usual record: one id
_INT = struct.Struct("<i")
ENDS = {"stop": -1, "length": -2}
_REASONS = {code: reason for reason, code in ENDS.items()}


@lru_cache(maxsize=256)
def _ids(n: int) -> struct.Struct:
    return struct.Struct(f"<iii{n}i")


def ids_record(index: int, seq: int, ids: list[int], logprobs: list[float] | None = None) -> bytes:
    """Choice `index`'s next ids (sent with the event numbered `seq`), and their log-probabilities if kept.
    On every event a worker sends: one precompiled pack (about 0.5 µs)."""
    n = len(ids)
    record = _ONE.pack(index, seq, 1, ids[0]) if n == 1 else _ids(n).pack(index, seq, n, *ids)
    if logprobs is not None:
        record += struct.pack(f"<{n}d", *logprobs)
    return record


def end_record(index: int, seq: int, reason: str, tokens: int) -> bytes:
    """Choice `index` ended (`stop` or `length`) after `tokens` tokens (its usage)."""
    return _HEADER.pack(index, seq, ENDS[reason]) + _INT.pack(tokens)


@dataclass
class ChoiceProgress:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    tokens: int = 0  # of an ended choice


@dataclass
class Progress:
    choices: dict[int, ChoiceProgress] = field(default_factory=dict)
    seq: int = 0  # of the last event recorded: the new worker numbers its events on from there

    @classmethod
    def read(cls, data: bytes, logprobs: bool) -> Progress:
        """The records of a job, in order; `logprobs`: whether the job asked for them (its records carry them).
        Raises ValueError on a truncated record."""
        progress, offset, size = cls(), 0, len(data)
        while offset < size:
            if offset + _HEADER.size > size:
                raise ValueError("a truncated record header")
            index, seq, n = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            choice = progress.choices.setdefault(index, ChoiceProgress())
            progress.seq = max(progress.seq, seq)
            if n < 0:
                if n not in _REASONS or offset + _INT.size > size:
                    raise ValueError(f"an unreadable end record ({n})")
                choice.finish, (choice.tokens,) = _REASONS[n], _INT.unpack_from(data, offset)
                offset += _INT.size
                continue
            end = offset + 4 * n + (8 * n if logprobs else 0)
            if end > size:
                raise ValueError("a truncated record")
            choice.ids.extend(struct.unpack_from(f"<{n}i", data, offset))
            if logprobs:
                choice.logprobs.extend(struct.unpack_from(f"<{n}d", data, offset + 4 * n))
            offset = end
        return progress
