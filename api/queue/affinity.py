"""Prefix affinity, the API's half: which worker a text job should wait for, and putting it in that worker's stream.

A job's prompt (the rendered chat template, or the completion's text or ids) is cut at block boundaries and each
cumulative prefix hashed (blake2b, 8 bytes) — the rendered text, not tokens: no tokenizer in the API, and a
chat template renders a conversation's earlier turns to the same leading text each time. Blocks are
`affinity_block_chars` (64 ids for a token prompt) and double every 16 blocks, so a long prompt has a few dozen
digests. A `prompt_cache_key` (or the `X-Ovq-Session` header) names the conversation outright: its digest comes
first. This is llm-d's prefix scorer (chained block hashes, longest match wins) without its per-pod index: the
worker that ran a job records its digests (`Keys.prefix_owner`, expiring), so the longest recorded prefix names the
worker whose engine most likely still holds its KV blocks.

The preferred worker gets the job only while it is live and has fewer than `affinity_max_waiting` jobs waiting in
its affinity stream (Dynamo's router weighs overlap against load the same way, here as a cutoff); else the next
longest match's worker, else the shared stream as before. Only interactive text jobs without images take part:
a higher or lower level keeps its own stream (and its meaning), images would need their pixels hashed.
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from common.fairness import START_FIELD, START_OF
from common.jobs import ENTRY_JOB, Job, JobHash, JobStatus
from common.keys import Keys

DIGEST_BYTES = 8
DOUBLE_EVERY = 16  # blocks of one size before the block doubles
TOKEN_BLOCK = 64  # ids per block of a token-id prompt
SESSION_HEADER = "x-ovq-session"

# KEYS: the job hash, then per candidate (preferred first): its device's workers zset, its affinity stream, its
# device's draining workers (`Keys.affinity_draining`), its device's interactive fair clock (`Keys.fair_clock`).
# ARGV: oldest live heartbeat, most jobs waiting, job TTL, created, reply_to, model, tenant ('' when the job carries
# none), its cost over its weight, then per candidate its worker id, its device and the job as JSON (as that worker
# would get it). The first candidate that is live (heartbeat), not draining and has fewer than ARGV[2] undelivered
# entries gets the job; with a tenant, only if the job's virtual start (common/fairness.py: max(v, F[tenant])) is
# not before the last waiting entry's (its START_FIELD): a stream stays in fair order, and a job that should run
# before those waits in the shared stream, where the worker weighs it against its stream (workers/queue/affinity.py).
# The job goes in with its virtual start, and F[tenant] moves on as a parked job's does.
# Returns 'candidate (1-based) entry-id' as one string (see api/queue/registry.py ENQUEUE), or '0' for none.
ENQUEUE = START_OF + f"""
local tenant, cost = ARGV[7], tonumber(ARGV[8])
for i = 1, (#KEYS - 1) / 4 do
  local workers, stream, draining, clock = KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i], KEYS[4 * i + 1]
  local worker, device, job = ARGV[6 + 3 * i], ARGV[7 + 3 * i], ARGV[8 + 3 * i]
  local beat = redis.call('ZSCORE', workers, worker)
  if beat and tonumber(beat) >= tonumber(ARGV[1]) and not redis.call('ZSCORE', draining, worker) then
    local waiting = redis.call('XLEN', stream)
    local ok, pending = pcall(redis.call, 'XPENDING', stream, 'workers')
    if ok then waiting = waiting - pending[1] end
    local start, in_order = nil, true
    if tenant ~= '' then
      start = math.max(tonumber(redis.call('HGET', clock, 'v') or '0'),
                       tonumber(redis.call('HGET', clock, 'f:' .. tenant) or '0'))
      if waiting > 0 then
        local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
        local s = last and start_of(last[2])
        in_order = s == nil or start >= s
      end
    end
    if waiting < tonumber(ARGV[2]) and in_order then
      redis.call('HSET', KEYS[1], '{JobHash.STATUS}', '{JobStatus.QUEUED}', '{JobHash.CREATED}', ARGV[4],
                 '{JobHash.API}', ARGV[5], '{JobHash.MODEL}', ARGV[6], '{JobHash.DEVICE}', device)
      redis.call('EXPIRE', KEYS[1], ARGV[3])
      local id
      if start then
        id = redis.call('XADD', stream, '*', '{ENTRY_JOB}', job, '{START_FIELD}', start)
        redis.call('HSET', clock, 'f:' .. tenant, start + cost)
        redis.call('EXPIRE', clock, ARGV[3])
      else
        id = redis.call('XADD', stream, '*', '{ENTRY_JOB}', job)
      end
      redis.call('EXPIRE', stream, ARGV[3])
      return i .. ' ' .. id
    end
  end
end
return '0'
"""


def boundaries(length: int, block: int) -> list[int]:
    """Where the prefixes end: every `block` units, the block doubling every DOUBLE_EVERY blocks."""
    ends, pos, step, run = [], 0, block, 0
    while pos + step <= length:
        pos += step
        ends.append(pos)
        run += 1
        if run == DOUBLE_EVERY:
            step, run = step * 2, 0
    return ends


def prefix_digests(prompt: str | list[int], block_chars: int, key: str | None = None) -> list[str]:
    """The prompt's prefix digests, the most specific first: the cache key's, then the longest prefix's down to the
    shortest. A prompt shorter than one block has none but the key's."""
    digests = []
    if isinstance(prompt, str):
        data, ends = prompt.encode(), [len(prompt[:end].encode()) for end in boundaries(len(prompt), block_chars)]
    else:
        data = array("q", prompt).tobytes()
        ends = [end * 8 for end in boundaries(len(prompt), TOKEN_BLOCK)]
    hasher, at = hashlib.blake2b(digest_size=DIGEST_BYTES), 0
    for end in ends:
        hasher.update(data[at:end])
        at = end
        digests.append(hasher.hexdigest())
    digests.reverse()
    if key:
        digests.insert(0, "k" + hashlib.blake2b(key.encode(), digest_size=DIGEST_BYTES).hexdigest())
    return digests


def eligible(job: Job) -> bool:
    return job.kind in ("chat", "completion") and job.priority == "interactive" and not job.images


@dataclass
class Candidate:
    device: str
    worker: str


def candidates(owners: list[bytes | None], devices: list[str]) -> list[Candidate]:
    """The recorded owners of the digests (as MGET answers them, most specific first), deduplicated, on the
    servable's devices."""
    seen: set[str] = set()
    found = []
    for owner in owners:
        if owner is None:
            continue
        device, _, worker = owner.decode().partition("|")
        if worker and device in devices and worker not in seen:
            seen.add(worker)
            found.append(Candidate(device, worker))
    return found


def enqueue_args(keys: Keys, job: Job, found: list[Candidate], since: float, max_waiting: int,
                 job_ttl_s: int) -> tuple[list[str], list[object]]:
    """The ENQUEUE script's keys and args for `found` (the job as each candidate would get it)."""
    touched: list[str] = [keys.job(job.id, job.model)]
    share = job.share
    args: list[object] = [since, max_waiting, job_ttl_s, job.created, job.reply_to, job.model,
                          share.tenant if share else "", share.cost / share.weight if share else 0]
    for candidate in found:
        touched += [keys.workers(job.model, candidate.device),
                    keys.affinity_jobs(job.model, candidate.device, candidate.worker),
                    keys.affinity_draining(job.model, candidate.device),
                    keys.fair_clock(job.model, candidate.device, job.priority)]
        payload = job.model_copy(update={"device": candidate.device, "affinity": candidate.worker})
        args += [candidate.worker, candidate.device, payload.to_json()]
    return touched, args
