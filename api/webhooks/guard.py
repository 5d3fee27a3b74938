"""SSRF defence: a webhook connects only to public addresses, unless the operator allows others
(OVQ_WEBHOOK_ALLOW_PRIVATE).

The check is made where the connection is made (an httpcore network backend), on every address the host resolves
to, and the connection goes to an address so checked: a name that resolves to a public address when checked and
to 127.0.0.1 when connecting (DNS rebinding) cannot slip through. Redirects are not followed (httpx's default), so
a public receiver cannot bounce a delivery inward either.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


class AddressRefused(Exception):
    """The endpoint's host is, or resolves to, an address webhooks may not go to."""


def public(address: str) -> bool:
    """Whether an address is public: not loopback, private, link-local, shared, multicast, reserved, unspecified."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # (an IPv6 zone id says nothing of the address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class CheckedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, allow_private: bool) -> None:
        self.inner, self.allow_private = httpcore.AnyIOBackend(), allow_private

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        refused = [a for a in addresses if not public(a)]
        if refused and not self.allow_private:
            raise AddressRefused(f"{host} is or resolves to {refused[0]}, not a public address "
                                 "(OVQ_WEBHOOK_ALLOW_PRIVATE allows it)")
        error: Exception = httpcore.ConnectError(f"no address for {host}")
        for address in addresses:
            try:
                return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        raise error

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("webhooks do not go to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class CheckedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool whose connections are checked (httpx takes no network backend of
    its own; httpcore's pool does), verifying TLS against the system's trust store."""

    def __init__(self, allow_private: bool) -> None:
        super().__init__()
        self._pool = httpcore.AsyncConnectionPool(ssl_context=ssl.create_default_context(),
                                                  network_backend=CheckedBackend(allow_private))


def client(timeout_s: float, allow_private: bool) -> httpx.AsyncClient:
    """The deliverers' client: no redirects, no proxies from the environment, one timeout for every phase."""
    return httpx.AsyncClient(transport=CheckedTransport(allow_private), timeout=timeout_s, follow_redirects=False,
                             trust_env=False)
