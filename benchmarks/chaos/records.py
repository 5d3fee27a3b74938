"""What the chaos run writes down: one `Request` per client request (what the client received, as it arrived) and
one `Fault` per fault injected. The checker proves its claims from these alone (and from what it reads back from
the server), so a test can hand it synthetic ones."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Kinds of request, as the table names them.
STREAM, CHAT, BACKGROUND, BATCH, EMBEDDING = "stream", "chat", "background", "batch line", "embedding"
KINDS = (STREAM, CHAT, BACKGROUND, BATCH, EMBEDDING)


@dataclass
class Request:
    kind: str
    key: str  # the client's own name for it (unique in the run)
    sent: float  # unix s
    api: str = ""  # the API base it was first sent to
    prompt: str = ""
    job: str = ""  # the server's id: a job id (streams, chats, batch lines) or a response id (background)
    text: str = ""  # what the client received, deltas joined in the order they arrived
    marks: list[tuple[float, int]] = field(default_factory=list)  # (unix s, len(text)) as each delta arrived
    events: list[int] = field(default_factory=list)  # SSE event numbers, in arrival order
    terminals: list[str] = field(default_factory=list)  # each terminal outcome the client saw: "done", "error:CODE"
    statuses: list[int] = field(default_factory=list)  # each HTTP status it got (a resume is a second request)
    transport_errors: list[str] = field(default_factory=list)  # connections lost, with when (unix s)
    resumes: int = 0  # times it reconnected (Last-Event-ID, starting_after) to an API
    first: float | None = None  # unix s of the first content (TTFT)
    ended: float | None = None  # unix s of its terminal outcome (None: none came: hung or lost)
    solo: bool = False  # sent while nothing else of the workload ran (its greedy text has a sound reference)
    reference: str | None = None  # the greedy answer of the same body, alone, in calm
    server_text: str | None = None  # what the server recorded as its output (read back as the run goes)
    read_back: float | None = None  # unix s its server record was read (job records expire: OVQ_JOB_TTL_S)
    # A resumable stream's journal as the server kept it: (event number, whether it must reach the client as a
    # frame: text or the end; an `accepted` again after a takeover, or a delta with no text, makes none).
    journal: list[tuple[int, bool]] | None = None
    vector: list[float] | None = None  # embeddings: what the client received
    reference_vector: list[float] | None = None  # embeddings: the same text's, alone, in calm

    def add_text(self, delta: str, now: float) -> None:
        self.text += delta
        self.marks.append((now, len(self.text)))
        self.first = self.first or now

    def text_before(self, when: float) -> str:
        """What it had received before `when`."""
        return self.text[:max((n for t, n in self.marks if t < when), default=0)]


@dataclass
class Fault:
    kind: str
    target: str  # the container
    began: float  # unix s
    ended: float = 0.0  # when the fleet had recovered (the container back, the failover done)
    note: str = ""


@dataclass
class RedisState:
    """Keys and memory of the primary, at the baseline or after the run."""
    keys: dict[str, int]  # key -> TTL in s (-1: none)
    used_memory: int
    streams: dict[str, int] = field(default_factory=dict)  # stream key -> length


@dataclass
class Run:
    requests: list[Request]
    faults: list[Fault]
    baseline: RedisState | None = None
    after: RedisState | None = None
    kv_usage: dict[str, float] = field(default_factory=dict)  # idle worker -> ovq_worker_kv_cache_usage_ratio
    apis: dict[str, str] = field(default_factory=dict)  # API base URL -> its container
    harness_statuses: list[int] = field(default_factory=list)  # statuses of the harness's own calls
    began: float = 0.0
    finished: float = 0.0


def save(run: Run, path: Path) -> None:
    path.write_text(json.dumps(asdict(run), default=str))


def load(path: Path) -> Run:
    """A run as `save` wrote it (JSON makes tuples lists: they are made tuples again)."""
    data = json.loads(path.read_text())
    requests = [Request(**{**r, "marks": [tuple(m) for m in r["marks"]],
                           "journal": None if r["journal"] is None else [tuple(j) for j in r["journal"]]})
                for r in data.pop("requests")]
    faults = [Fault(**f) for f in data.pop("faults")]
    states = {name: None if data[name] is None else RedisState(**data.pop(name)) for name in ("baseline", "after")}
    return Run(requests, faults, **states, **{k: v for k, v in data.items() if k not in states})
