"""What a pool worker loads and unloads: pure decisions from the fleet's waiting work and what is resident now.

Rules, in order, each tick:
1. A resident model with nothing running and nothing waiting for `keep_alive` seconds is unloaded (Ollama's
   `keep_alive`: negative keeps it for good, 0 unloads it as soon as it is idle).
2. The model with the most waiting work that is not resident is loaded, one load at a time (loads compete for the
   same cores). Waiting work scores its tokens, doubled for every `age_doubling_s` its oldest job has waited; a model
   whose oldest job has waited `starve_s` comes first whatever its tokens, and may swap out a model at work.
3. When it does not fit the memory budget, residents are unloaded to make room: only those resident for at least
   `min_residency_s` (so two models with waiting work do not swap back and forth on every tick), whose own score is
   below the newcomer's, and that run nothing (a model at work is swapped out only for a starving one: its stream
   of requests would wait for its reload); idle ones first, then the least waited-for. A model larger than the whole
   budget is never loaded.
Work for a model that other workers serve counts once it has waited `served_grace_s`: they likely take it first;
a model another pool is loading (its claim, `Keys.pool_claim`) is left to it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Demand:
    """A model's waiting work in the fleet's queue (on this pool's device)."""

    waiting: int = 0  # jobs not yet taken by any worker, requests waiting for its first card included
    tokens: int = 0  # their estimated tokens (prompt + expected output)
    oldest_s: float = 0.0  # how long the oldest of them has waited
    served: bool = False  # some worker outside this pool serves the model now
    claimed: bool = False  # another pool is loading it now

    def score(self, age_doubling_s: float) -> float:
        if self.waiting <= 0:
            return 0.0
        return max(self.tokens, self.waiting) * (1.0 + self.oldest_s / age_doubling_s)


@dataclass(frozen=True)
class Resident:
    """A model this pool has loaded (or is loading)."""

    model: str
    footprint: int  # bytes (workers/pool/footprint.py)
    loaded_at: float  # when its load began (monotonic s)
    idle_since: float | None  # when its last job ended, nothing running since; None: busy or loading
    keep_alive_s: float  # the last request's `keep_alive`, else the setting's
    running: int = 0  # jobs it runs now


@dataclass(frozen=True)
class Limits:
    budget: int  # bytes the resident models' footprints may add up to
    min_residency_s: float = 10.0
    age_doubling_s: float = 10.0
    starve_s: float = 150.0
    # A model other workers serve counts as waiting only once its oldest job waited this long: they likely take it.
    served_grace_s: float = 2.0


@dataclass(frozen=True)
class Plan:
    unload: list[str] = field(default_factory=list)
    load: str | None = None
    why: str = ""


def _idle_expired(r: Resident, demand: Demand, now: float) -> bool:
    if r.idle_since is None or demand.waiting > 0 or r.keep_alive_s < 0:
        return False
    return now - r.idle_since >= r.keep_alive_s


def rank(candidates: dict[str, Demand], limits: Limits) -> list[str]:
    """Models with waiting work, most deserving first: the starving (oldest first), then by score."""
    def key(model: str) -> tuple[int, float]:
        d = candidates[model]
        starving = d.oldest_s >= limits.starve_s
        return (0, -d.oldest_s) if starving else (1, -d.score(limits.age_doubling_s))

    wanted = (m for m, d in candidates.items()
              if d.waiting > 0 and not d.claimed and (not d.served or d.oldest_s >= limits.served_grace_s))
    return sorted(wanted, key=lambda m: (*key(m), m))


def decide(residents: list[Resident], demand: dict[str, Demand], footprints: dict[str, int], limits: Limits,
           now: float, loading: bool = False) -> Plan:
    """What to do now. `footprints`: every model the pool may serve; `loading`: a load is under way (no second
    one starts, and nothing is evicted for one meanwhile)."""
    none = Demand()
    expired = [r.model for r in residents if _idle_expired(r, demand.get(r.model, none), now)]
    kept = [r for r in residents if r.model not in expired]
    if loading:
        return Plan(unload=expired, why="idle past keep_alive" if expired else "")
    resident = {r.model for r in residents}
    waiting = {m: d for m, d in demand.items() if m not in resident and m in footprints}
    for model in rank(waiting, limits):
        need = footprints[model]
        if need > limits.budget:
            continue  # never fits: the pool's log says so once (supervisor)
        free = limits.budget - sum(r.footprint for r in kept)
        if need <= free:
            return Plan(unload=expired, load=model, why="waiting work, room free")
        victims = _victims(kept, demand, limits, now, need - free, _priority(waiting[model], limits))
        if victims is not None:
            return Plan(unload=[*expired, *victims], load=model, why="waiting work, swapped in")
    return Plan(unload=expired, why="idle past keep_alive" if expired else "")


def _priority(d: Demand, limits: Limits) -> float:
    return math.inf if d.oldest_s >= limits.starve_s else d.score(limits.age_doubling_s)


def _victims(kept: list[Resident], demand: dict[str, Demand], limits: Limits, now: float, short: int,
             newcomer: float) -> list[str] | None:
    """The fewest residents, idle and least waited-for first, whose unloading frees `short` bytes; None when
    those that may go (resident long enough, less deserving than the newcomer) do not free enough."""
    none = Demand()
    eligible = [r for r in kept if now - r.loaded_at >= limits.min_residency_s
                and _priority(demand.get(r.model, none), limits) < newcomer
                and (not r.running or newcomer == math.inf)]
    eligible.sort(key=lambda r: (r.idle_since is None, demand.get(r.model, none).score(limits.age_doubling_s),
                                 -(now - (r.idle_since or now)), r.model))
    chosen, freed = [], 0
    for r in eligible:
        if freed >= short:
            break
        chosen.append(r.model)
        freed += r.footprint
    return chosen if freed >= short else None
