"""A tenant's fair-share correction when its job ends (common/fairness.py): its finish time moves by (tokens the
job took - its estimate) / weight, once per job however often the round trip carrying it is sent.

The publisher sends a batch again when Redis was away (`Publisher._send_until_sent`), and a lane retries a round
trip on a fresh connection: either can follow a round trip that Redis did apply. A bare HINCRBYFLOAT would then
move the tenant twice; so the correction is made by a script that marks the job's hash (`JobHash.FAIR`) and does
nothing when the mark is already there. The job's hash and the clock live in the model's slot on a Cluster.
"""
from __future__ import annotations

from common.jobs import JobHash
from common.redis.lane import Command

# KEYS: the level's clock, the job's hash. ARGV: the tenant, the correction, the clock's TTL (s).
# Returns 1 when the correction was made, 0 when it had been.
CORRECT = f"""
local exists = redis.call('EXISTS', KEYS[2]) == 1
if exists and redis.call('HGET', KEYS[2], '{JobHash.FAIR}') then return 0 end
if exists then redis.call('HSET', KEYS[2], '{JobHash.FAIR}', ARGV[2]) end
redis.call('HINCRBYFLOAT', KEYS[1], 'f:' .. ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


def correction(clock: str, job_hash: str, tenant: str, tokens: float, ttl_s: int) -> Command:
    """The command that moves `tenant`'s finish time in `clock` by `tokens` (already divided by its weight), once
    for the job whose hash is `job_hash`. EVAL, not EVALSHA: a round trip's commands cannot fall back on NOSCRIPT;
    Redis caches the script by its digest all the same."""
    return ["EVAL", CORRECT, 2, clock, job_hash, tenant, tokens, ttl_s]
