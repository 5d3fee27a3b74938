"""Fair shares per tenant: when a model's queue is contended, workers take waiting jobs in weighted fair order by
tokens, across every API process and worker, with all the state in Redis.

The tenant is the API key's (`KeyAttributes.who`), or the request's `user` field when keys are off; a job
without one (or with OVQ_FAIRNESS=0) is queued and read exactly as before: first come, first served.

How (start-time fair queueing, SFQ, over the existing streams):
- A job that carries a tenant (`Job.share`) still goes into its level's stream (`Keys.level_jobs`), so stream
  lengths (the backlog bound, KEDA's `streamLength`), acks, deletes, reclaim of dead workers, dead letters and
  `WITHDRAW` all see it as before. In the same enqueue script it is *parked*: read at once by the consumer
  `PARK` of the group (so a worker's plain `XREADGROUP >` never takes it out of order) and given a virtual start
  time `S = max(v, F[tenant])`, its finish `F[tenant] = S + cost / weight`, in the level's order set
  (`Keys.fair_order`, member `ENTRY|TENANT`, score `S`) and clock (`Keys.fair_clock`: `v`, `f:T`, `n:T`).
- A worker's read (workers/queue/intake.py) first takes plain undelivered entries as before (jobs without a
  tenant), then pops the lowest `S` of the level and `XCLAIM`s that entry from `PARK` (delivery count 1, as a
  first read), and sets `v = S`. A tenant back from idle restarts at `v` (`max`): no banked credit; a flood of
  one tenant is tagged `v, v+c, v+2c, ...` at once, so another tenant's job arriving later is tagged `v` and
  runs next: it never waits behind more than the jobs already started.
- When the job ends its worker corrects `F[tenant]` by (actual tokens - estimate) / weight.
- An idle worker blocks on its streams and the model's bell (`Keys.fair_bell`, capped), which the enqueue rings
  when it parks a job, so a parked job wakes a worker as a plain entry does.
- Aging across levels counts a level's oldest parked job too; a parked job counts as waiting (not in flight)
  everywhere waiting jobs are counted (`in_flight` below).

Batch API lines (level `batch`) carry a tenant, and are parked, when they run as their batch's owner's
(api/batch/lines.py): batches of several tenants share the batch level fairly (it still runs only when nothing else
waits). Left out: the tags of jobs already parked are not corrected (only the tenant's next ones).
"""
from __future__ import annotations

from typing import Any

from common.jobs import Job, VideoParams

PARK = "fair:parked"  # the consumer that holds parked jobs (never a worker: reclaim passes it by)
BELL_LEN = 32  # rings kept in a bell stream
CLOCK_CAP = 4096  # clock fields beyond which the enqueue drops finish times already behind `v`
DEFAULT_OUTPUT_TOKENS = 256  # a job's expected output when it sets no max_tokens (corrected at its end)
CHARS_PER_TOKEN = 4  # the API does not tokenize: a text prompt's tokens are estimated from its length
TENANT_MAX_CHARS = 64
START_FIELD = "s"  # a stream entry's field: its job's virtual start, where the entry is not parked (prefix affinity)
# Lua: an entry's START_FIELD (its fields as a flat list), nil for none. Shared by the API's affinity enqueue and the
# worker's affinity reads.
START_OF = f"""
local function start_of(fields)
  for j = 1, #fields, 2 do
    if fields[j] == '{START_FIELD}' then return tonumber(fields[j + 1]) end
  end
  return nil
end
"""
# A video job's work in token-equivalents: one denoising step over one latent token, which LTX-Video's VAE makes of
# 32 x 32 pixels x 8 frames. A 4 s 704x480 clip at 25 fps (105 frames) in 25 steps costs 25 x 14 x 22 x 15 = 115,500.
VIDEO_TOKEN_PIXELS, VIDEO_TOKEN_FRAMES = 32, 8


def in_flight(pending: Any) -> int:
    """Jobs held by workers, from XPENDING's summary (redis-py's dict, or a lane's raw reply: [count, first, last,
    [[consumer, count], ...]]): pending minus those parked, which wait."""
    if isinstance(pending, list):
        total, consumers = int(pending[0]), [{"name": c[0], "pending": c[1]} for c in pending[3] or ()]
    else:
        total, consumers = int(pending["pending"]), pending.get("consumers") or ()
    for consumer in consumers:
        name = consumer["name"]
        if (name.decode() if isinstance(name, bytes) else name) == PARK:
            total -= int(consumer["pending"])
    return max(total, 0)


def _tokens(prompt: str | list[Any]) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(prompt) // CHARS_PER_TOKEN + 1


def video_work(params: VideoParams) -> int:
    """Steps x latent frames x latent tokens per frame (the transformer's work; the VAE's is small beside it)."""
    latent_frames = (params.num_frames - 1) // VIDEO_TOKEN_FRAMES + 1
    tokens = -(-params.width // VIDEO_TOKEN_PIXELS) * -(-params.height // VIDEO_TOKEN_PIXELS)
    return params.num_inference_steps * latent_frames * tokens


def estimate_cost(job: Job) -> int:
    """Tokens the job is expected to cost: its prompt plus its expected output (max_tokens, or a default) for each
    sample; embeddings and rerank by their inputs; a video by its work (`video_work`); other kinds a default."""
    if job.kind in ("chat", "completion"):
        params = job.params
        output = params.max_tokens if params.max_tokens is not None else DEFAULT_OUTPUT_TOKENS
        return _tokens(job.prompt) + output * max(params.n, params.best_of or 1)
    if job.video is not None:
        return video_work(job.video)
    if job.embed is not None:
        return sum(_tokens(text) for text in job.embed.inputs) + (_tokens(job.embed.query) if job.embed.query else 0)
    return DEFAULT_OUTPUT_TOKENS


def tenant_counts(clock: dict[bytes, bytes]) -> dict[str, int]:
    """Parked jobs per tenant, from a level's clock hash (`n:TENANT` fields)."""
    counts = {}
    for field, value in clock.items():
        if field.startswith(b"n:") and int(value) > 0:
            counts[field[2:].decode(errors="replace") or "(none)"] = int(value)
    return counts
