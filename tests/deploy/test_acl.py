"""deploy/redis: the Cluster ACL file is the single-Redis one plus what a Cluster's clients need, never less (a
command a tier's script runs, added to one file only, refuses that tier on the other)."""
from __future__ import annotations

from tests.deploy.conftest import DEPLOY

CLUSTER_ONLY = {"+asking", "+command", "+cluster|nodes", "+cluster|shards", "+cluster|slots", "+pubsub|shardnumsub",
                "+spublish", "+ssubscribe", "+sunsubscribe"}


def _users(name: str) -> dict[str, set[str]]:
    lines = (DEPLOY / "redis" / name).read_text().splitlines()
    return {line.split()[1]: set(line.split()[2:]) for line in lines if line.startswith("user ")}


def test_the_cluster_acl_grants_each_user_what_the_single_redis_acl_does_and_only_cluster_commands_more() -> None:
    single, cluster = _users("users.acl"), _users("users-cluster.acl")
    for user, rules in cluster.items():
        assert single[user] <= rules, (user, sorted(single[user] - rules))
        assert rules - single[user] <= CLUSTER_ONLY, (user, sorted(rules - single[user] - CLUSTER_ONLY))
