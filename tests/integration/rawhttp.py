"""Raw HTTP over a socket, for what clients normally cannot do: send slowly, stop reading, leave mid-body."""
from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit


def connect(base: str, timeout: float = 10, rcvbuf: int | None = None) -> socket.socket:
    url = urlsplit(base)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so the advertised window stays small
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect((url.hostname, url.port))
    return s


def request_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    # (Host: a name a loopback API answers to: api/http/hosts.py)
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length (what every refusal here has)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed_by_peer(s: socket.socket, within: float) -> bool:
    """True when the server closes the connection (EOF or reset) within `within` seconds; what it sent is dropped."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False
