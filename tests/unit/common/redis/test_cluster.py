from __future__ import annotations

import socketserver
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, RedisClusterException, SlotNotCoveredError, TryAgainError
from redis.retry import Retry

from common.redis.client import NO_CLIENT_INFO, UNAVAILABLE
from common.redis.cluster import (
    ClusterURL,
    ClusterURLError,
    SlotMasterConnection,
    is_cluster,
    key_of,
    slot_of,
    unreachable,
)


def test_a_cluster_url_names_its_seed_nodes_and_credentials() -> None:
    url = ClusterURL.parse("rediss+cluster://ovq:p%40ss@10.0.0.1:7000,[::1]:7001,redis-2?socket_timeout=2")
    assert url.nodes == [("10.0.0.1", 7000), ("::1", 7001), ("redis-2", 6379)]
    assert (url.username, url.password, url.ssl) == ("ovq", "p@ss", True)
    assert url.node_kwargs()["socket_timeout"] == 2
    assert is_cluster("redis+cluster://h:1") and not is_cluster("redis://h:1")


def test_a_cluster_has_no_database_to_choose() -> None:
    with pytest.raises(ClusterURLError, match="no databases"):
        ClusterURL.parse("redis+cluster://h:7000/1")


@pytest.mark.parametrize(("command", "key"), [
    (["EVALSHA", "sha", 2, "ovq:job:{m:a}:1", "ovq:jobs:{m:a}:CPU", "x"], "ovq:job:{m:a}:1"),
    (["EVALSHA", "sha", 0, "x"], None),
    (["XREADGROUP", "GROUP", "g", "c", "COUNT", 1, "BLOCK", 5, "STREAMS", "s1", "s2", ">", ">"], "s1"),
    (["SPUBLISH", "ovq:ev:{a:api-1}", b"data"], "ovq:ev:{a:api-1}"),
    (["PUBSUB", "SHARDNUMSUB", "ovq:ev:{a:api-1}"], "ovq:ev:{a:api-1}"),
    (["HSET", "ovq:job:{m:a}:1", "status", "done"], "ovq:job:{m:a}:1"),
    (["PING"], None),
])
def test_each_command_is_routed_by_its_key(command: list, key: str | None) -> None:
    assert key_of(command) == key


def test_a_models_keys_share_its_slot() -> None:
    assert slot_of("ovq:job:{m:a}:1") == slot_of(b"ovq:jobs:{m:a}:CPU") != slot_of("ovq:jobs:{m:b}:CPU")


def test_a_cluster_failing_over_is_waited_out_as_redis_away() -> None:
    """No node answering, a master down before its replica's promotion: what the tiers' retry loops wait out."""
    with pytest.raises(redis.ConnectionError), unreachable():
        raise RedisClusterException("Redis Cluster cannot be connected")
    for failing in (ClusterDownError("CLUSTERDOWN"), TryAgainError("TRYAGAIN"), SlotNotCoveredError("slot 7")):
        assert isinstance(failing, UNAVAILABLE)


def test_the_batch_apis_slot_client_takes_a_failing_over_cluster_for_a_lost_connection() -> None:
    """rq's client (`SlotMaster`) on a node that answers CLUSTERDOWN (a master failing over) or MOVED: the command
    is sent again on a new connection, to wherever the slot is then (rq's own loop retries lost connections with
    backoff; any other error ended the batch worker with a traceback at every failover)."""
    replies = [b"-CLUSTERDOWN The cluster is down\r\n", b"-MOVED 3999 127.0.0.1:1\r\n", b"+PONG\r\n"]
    asked: list[bool] = []

    class Node(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            while self.request.recv(4096) and replies:
                self.request.sendall(replies.pop(0))

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True

    with Server(("127.0.0.1", 0), Node) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()

        def locate(refresh: bool) -> tuple[str, int]:
            asked.append(refresh)
            return server.server_address

        pool = redis.ConnectionPool(connection_class=SlotMasterConnection, locate=locate, retry=Retry(NoBackoff(), 3),
                                    protocol=2, **NO_CLIENT_INFO)  # RESP2: no HELLO for this node to answer
        client = redis.Redis(connection_pool=pool)
        assert client.ping() is True
        pool.disconnect()
        server.shutdown()
    assert asked == [False, True, True]  # each new connection after a refusal asked the cluster where the slot is
