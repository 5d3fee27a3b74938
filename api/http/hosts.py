"""The browser cannot be turned against an ovq: the Host check (DNS rebinding) and the cross-site check.

- **Host** (DNS rebinding, the class of Ollama's CVE-2024-28224): a page on `evil.example` whose name its DNS then
  points at 127.0.0.1 reaches a loopback API as same-origin, with `Host: evil.example`. So an API bound to loopback
  answers only requests whose Host names it as this machine does (`localhost`, `*.localhost`, a loopback address)
  or as `allowed_hosts` (OVQ_ALLOWED_HOSTS) says; bound to another address, it checks the Host only when
  `allowed_hosts` is set (then that list, the bind address and the loopback names). Everything else: 403
  `host_not_allowed`, on /v1, /v3 and /ops alike (the health probes excepted: orchestrators probe by address).
- **Cross-site** (CSRF): a page elsewhere can make the browser POST a form to any address, keys or not (the ops
  page's Basic auth is sent along). So a request that changes something (any method but GET, HEAD, OPTIONS) that
  a browser marks as coming from another site is refused (403 `cross_site_request`): `Sec-Fetch-Site` other than
  `same-origin` or `none` (every current browser sends it), or, without it, an `Origin` that is not this
  host. Clients that are not browsers (the SDKs, curl, the batch worker) send neither and are not affected.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.auth import OPEN, is_loopback
from common.settings import Settings

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
SAME = (b"same-origin", b"none")  # Sec-Fetch-Site values of a request the page itself, or the user, made
WILDCARD_BINDS = ("0.0.0.0", "::", "")
KNOWN_CACHED = 256  # Host values remembered with their verdict (a client sends the same one on every request)


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value
    return None


def host_name(host: str) -> str:
    """`Host`'s name without its port (`[::1]:8000` -> `::1`), lower case."""
    return (urlsplit(f"//{host}").hostname or "").lower()


class HostGuard:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.allowed = {name.strip().lower().strip("[]") for name in settings.allowed_hosts if name.strip()}
        self.any_host = "*" in self.allowed
        self.check_host = not self.any_host and (is_loopback(settings.host) or bool(self.allowed))
        if settings.host not in WILDCARD_BINDS:
            self.allowed.add(settings.host.lower().strip("[]"))
        self._verdicts: dict[bytes, bool] = {}

    def known(self, host: bytes | None) -> bool:
        """The Host names this server: a loopback name, or an allowed one. (No Host at all: not a browser.)"""
        if host is None:
            return True
        verdict = self._verdicts.get(host)
        if verdict is None:
            name = host_name(host.decode("latin-1"))
            verdict = is_loopback(name) or name.endswith(".localhost") or name in self.allowed
            if len(self._verdicts) >= KNOWN_CACHED:  # (any number of names may be tried: the cache stays small)
                self._verdicts.clear()
            self._verdicts[host] = verdict
        return verdict

    @staticmethod
    def cross_site(scope: Scope, host: bytes | None) -> bool:
        site = _header(scope, b"sec-fetch-site")
        if site is not None:
            return site.strip().lower() not in SAME
        origin = _header(scope, b"origin")
        if origin is None:
            return False
        return origin.strip() == b"null" or host is None or \
            urlsplit(origin.decode("latin-1").strip()).netloc.lower() != host.decode("latin-1").strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not OPEN.fullmatch(scope["path"]):
            host = _header(scope, b"host")
            if self.check_host and not self.known(host):
                shown = host.decode("latin-1")[:100] if host else ""
                return await _refuse(send, f"This server does not answer to the host name `{shown}`: it is bound to "
                                     "loopback and knows itself as localhost. An operator adds the names it is "
                                     "reached by to OVQ_ALLOWED_HOSTS", "host_not_allowed")
            if scope["method"] not in SAFE_METHODS and self.cross_site(scope, host):
                return await _refuse(send, "Cross-site requests may not change anything here: the request came from "
                                     "a page of another site (Sec-Fetch-Site / Origin)", "cross_site_request")
        await self.app(scope, receive, send)


async def _refuse(send: Send, message: str, code: str) -> None:
    body = orjson.dumps({"error": {"message": message, "type": "permission_error", "param": None, "code": code}})
    await send({"type": "http.response.start", "status": 403, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
