"""The SSRF guard: which addresses are public, and a connection refused for any address of a host that is not."""
from __future__ import annotations

import httpx
import pytest

from api.webhooks.guard import AddressRefused, client, public


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                                     "fe80::1", "100.64.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1", "224.0.0.1",
                                     "fc00::1", "240.0.0.1"])
def test_not_public(address: str) -> None:
    assert not public(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public(address: str) -> None:
    assert public(address)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x", "http://localhost:9/x", "http://[::1]:9/x",
                                 "http://169.254.169.254/latest/meta-data/"])
async def test_a_connection_to_a_non_public_address_is_refused_before_it_is_made(url: str) -> None:
    async with client(2.0, allow_private=False) as c:
        with pytest.raises(AddressRefused, match="not a public address"):
            await c.post(url, content=b"{}")


async def test_allowed_it_connects() -> None:
    async with client(2.0, allow_private=True) as c:  # nothing listens on port 9: refused by the kernel, not by us
        with pytest.raises(httpx.ConnectError):
            await c.post("http://127.0.0.1:9/x", content=b"{}")
