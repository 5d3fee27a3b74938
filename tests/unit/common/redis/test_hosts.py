"""common/redis/hosts.py: a multi-node URL's host list."""
from __future__ import annotations

import pytest

from common.redis.hosts import host_list


def test_ports_default_where_none_is_given_and_ipv6_keeps_its_brackets_off() -> None:
    assert host_list("a:1,b,[::1]:3,", 26379) == [("a", 1), ("b", 26379), ("::1", 3)]
    assert host_list(":7000", 6379) == [("localhost", 7000)]


def test_a_bad_port_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        host_list("a:x", 6379)
