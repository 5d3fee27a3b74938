"""The capacity model: what a load costs each tier in CPU, from unit costs measured by `benchmarks/capacity.py`.

Each tier's CPU (in cores) is linear in what a deployment knows before it runs:

    idle_per_worker * workers + idle_per_api * API processes
    + per_request * requests/s + per_token * tokens/s + per_step * engine steps/s
    + per_tenant_request * requests/s (when tenants share the models)

The step term is why the same tokens cost more spread over more workers: a worker publishes its jobs' events once
per engine step, so a step that carries one stream's token costs what a step carrying sixty-four does. Steps/s
follow from the load: each busy worker's step makes one token for each of its streams, so a fleet makes
tokens/s / (streams per busy worker) steps a second.

Redis runs a command at a time on one core, and an API process is one event loop: each is sized at `headroom` of a
core, and that is also where the first of them saturates (`limit`).
"""
from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

TIERS = ("api", "workers", "redis")
COSTS_FILE = Path(__file__).with_name("capacity_costs.json")
MAX_APIS = 4096  # a process's own idle cost above `headroom` would grow the count forever


class TierCosts(BaseModel):
    """One tier's CPU per unit of work, in microseconds."""
    model_config = ConfigDict(extra="forbid")
    idle_per_worker_us: float = Field(ge=0, description="per worker per second, with no load")
    idle_per_api_us: float = Field(ge=0, description="per API process per second, with no load")
    per_request_us: float = Field(ge=0)
    per_token_us: float = Field(ge=0, description="per streamed token")
    per_step_us: float = Field(ge=0, description="per engine step of a worker that has running jobs")
    per_tenant_request_us: float = Field(0.0, ge=0, description="what a request costs more when tenants share the "
                                         "model (an API key's lookup, the job's fair order)")


class Costs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    measured: str = Field(description="where and how these were measured")
    api: TierCosts
    workers: TierCosts = Field(description="the worker I/O halves (the engines' own CPU is not in the model)")
    redis: TierCosts

    @classmethod
    def load(cls, path: Path | None = None) -> Costs:
        return cls.model_validate_json((path or COSTS_FILE).read_bytes())


class Load(BaseModel):
    requests_per_s: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0, description="streamed (output) tokens a second, all requests together")
    streams: int = Field(ge=1, description="requests in flight at once")
    workers: int = Field(ge=1)
    apis: int = Field(ge=1, description="API processes")
    tenants: int = Field(0, ge=0, description="tenants sharing the models (0: no API keys, no fair shares)")

    @property
    def steps_per_s(self) -> float:
        busy = min(self.streams, self.workers)  # a stream is on one worker; more workers than streams idle
        return self.tokens_per_s * busy / self.streams

    @property
    def tenant_requests_per_s(self) -> float:
        return self.requests_per_s if self.tenants else 0.0


def predict(load: Load, costs: Costs) -> dict[str, float]:
    """Each tier's CPU, in cores."""
    out = {}
    for tier in TIERS:
        c: TierCosts = getattr(costs, tier)
        us = (c.idle_per_worker_us * load.workers + c.idle_per_api_us * load.apis + c.per_request_us
              * load.requests_per_s + c.per_token_us * load.tokens_per_s + c.per_step_us * load.steps_per_s
              + c.per_tenant_request_us * load.tenant_requests_per_s)
        out[tier] = us / 1e6
    return out


class Plan(BaseModel):
    load: Load
    cores: dict[str, float] = Field(description="each tier's CPU, in cores")
    api_processes: int
    redis_masters: int
    redis_jobs_per_s_limit: float | None = Field(description="requests/s one Redis master carries at `headroom` of a "
                                                             "core, at this load's tokens and steps per request "
                                                             "(None: requests cost it nothing)")
    api_jobs_per_s_limit: float | None = Field(description="the same for one API process")


def limit(c: TierCosts, load: Load, headroom: float) -> float | None:
    """The requests/s at which one process of a tier is `headroom` busy, at this load's shape (tokens and steps per
    request); its idle cost left out."""
    rate = max(load.requests_per_s, 1e-9)
    us = c.per_request_us + (c.per_token_us * load.tokens_per_s + c.per_step_us * load.steps_per_s
                             + c.per_tenant_request_us * load.tenant_requests_per_s) / rate
    return headroom * 1e6 / us if us > 0 else None


def plan(load: Load, costs: Costs, headroom: float = 0.7) -> Plan:
    """How many API processes and Redis masters carry `load`, each at most `headroom` of a core busy. The API
    processes' own idle cost depends on how many there are: grown until they carry their load."""
    apis = max(load.apis, 1)
    while predict(load.model_copy(update={"apis": apis}), costs)["api"] > headroom * apis and apis < MAX_APIS:
        apis += 1
    sized = load.model_copy(update={"apis": apis})
    cores = predict(sized, costs)
    masters = max(1, math.ceil(cores["redis"] / headroom))
    return Plan(load=sized, cores=cores, api_processes=apis, redis_masters=masters,
                redis_jobs_per_s_limit=limit(costs.redis, sized, headroom),
                api_jobs_per_s_limit=limit(costs.api, sized, headroom))
