"""Images in chat messages (`image_url` parts): fetched, checked and capped before a job is queued.

Accepted: `data:image/...;base64,` URLs; `http(s)` URLs whose scheme, host and port match an entry of
`allowed_media_domains` (no redirects, no user info, size cap, one timeout for the whole fetch); `file://` or
plain paths inside `allowed_local_media_path` (resolved, so no `..` or symlink escape). Anything else, a file
too large, or one that decodes to too many pixels is a 400.

Allow-list entries: `host` (http on port 80, https on 443: the default ports only), `host:port` (http or https
on that port), `scheme://host` and `scheme://host:port` (that scheme only). Hosts compare case-insensitively
and exactly (no subdomains); IPv6 hosts in brackets (`[::1]:8080`).

Every failed fetch (refused, unreachable, DNS, timeout, TLS, a status other than 200, a redirect) gets the same
message, so the API cannot be used to probe which ports or hosts answer; the detail goes to the log.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
from typing import NamedTuple
from urllib.parse import unquote, urlparse, urlsplit

import httpx
from PIL import Image

from common.errors import OvqError
from common.settings import Settings

PARAM = "messages"
FETCH_FAILED = "the image could not be fetched from its URL"
DEFAULT_PORTS = {"http": 80, "https": 443}
log = logging.getLogger("ovq.api.media")


class Origin(NamedTuple):
    scheme: str | None  # None: http or https
    host: str
    port: int | None  # None: the scheme's default port


def parse_origin(entry: str) -> Origin:
    """An allow-list entry: `host`, `host:port`, `scheme://host` or `scheme://host:port`."""
    parts = urlsplit(entry if "://" in entry else f"//{entry}")
    return Origin(parts.scheme.lower() or None, (parts.hostname or "").lower(), parts.port)


def allowed(url: httpx.URL, entries: list[str]) -> bool:
    port = url.port or DEFAULT_PORTS[url.scheme]
    for entry in entries:
        origin = parse_origin(entry)
        if origin.host != url.host.lower() or (origin.scheme and origin.scheme != url.scheme):
            continue
        if origin.port is None:
            if port == DEFAULT_PORTS[origin.scheme or url.scheme]:
                return True
        elif origin.port == port:
            return True
    return False


def check_image(data: bytes, settings: Settings, name: str = "image", param: str = PARAM) -> bytes:
    """The bytes, once Pillow has read the header (pixel cap, before decoding) and verified the file."""
    if len(data) > settings.max_upload_bytes:
        raise OvqError(f"{name} is over {settings.max_upload_bytes} bytes", param=param)
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
            if width * height > settings.max_upload_pixels:
                raise OvqError(f"{name} has {width}x{height} pixels, over the limit of {settings.max_upload_pixels}",
                               param=param)
            probe.verify()
    except OvqError:
        raise
    except Exception as exc:  # Pillow's messages carry reprs of the buffer: say what it is instead
        raise OvqError(f"{name} could not be read as an image file", param=param) from exc
    return data


def _data_url(url: str) -> bytes:
    header, _, payload = url.partition(",")
    if not header.startswith("data:image/") or not header.endswith(";base64"):
        raise OvqError("image data URLs must be data:image/<type>;base64,...", param=PARAM)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OvqError("image data URL is not valid base64", param=PARAM) from exc


def _local(path_text: str, settings: Settings) -> bytes:
    root = settings.allowed_local_media_path
    if root is None:
        raise OvqError("local image paths are not allowed on this server", param=PARAM)
    if "\x00" in path_text:
        raise OvqError("image path contains a null byte", param=PARAM)
    try:
        base = root.resolve()
        path = (base / path_text).resolve()
        if not path.is_relative_to(base):
            raise OvqError("image path is outside allowed_local_media_path", param=PARAM)
        if not path.is_file():
            raise OvqError("no image file at that path", param=PARAM)
        if path.stat().st_size > settings.max_upload_bytes:
            raise OvqError(f"image is over {settings.max_upload_bytes} bytes", param=PARAM)
        return path.read_bytes()
    except (OSError, ValueError) as exc:  # a name too long, a file unreadable or gone meanwhile
        raise OvqError("no readable image file at that path", param=PARAM) from exc


async def _fetch(url: httpx.URL, settings: Settings) -> bytes:
    limit = settings.max_upload_bytes
    async with httpx.AsyncClient(follow_redirects=False, timeout=settings.media_timeout_s, trust_env=False) as client:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise httpx.HTTPStatusError(f"HTTP {response.status_code}", request=response.request,
                                            response=response)
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise OvqError(f"image is over {limit} bytes", param=PARAM)
                chunks.append(chunk)
            return b"".join(chunks)


async def _remote(text: str, settings: Settings) -> bytes:
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, ValueError) as exc:
        raise OvqError("image URL is not a valid URL", param=PARAM) from exc
    if url.userinfo:
        raise OvqError("image URLs must not carry user info", param=PARAM)
    if not url.host or not allowed(url, settings.allowed_media_domains):
        raise OvqError("the image URL's scheme, host and port are not in allowed_media_domains", param=PARAM)
    try:
        # One deadline for the whole fetch: httpx's timeout is per read, and a server may trickle bytes.
        return await asyncio.wait_for(_fetch(url, settings), settings.media_timeout_s)
    except OvqError:
        raise
    except (httpx.HTTPError, OSError, asyncio.TimeoutError) as exc:
        log.info("image fetch from %s failed: %s", url.host, exc.__class__.__name__)
        raise OvqError(FETCH_FAILED, param=PARAM) from None


async def load_image(url: str, settings: Settings) -> bytes:
    scheme = urlparse(url).scheme
    if scheme == "data":
        data = _data_url(url)
    elif scheme in ("http", "https"):
        data = await _remote(url, settings)
    elif scheme == "file":
        data = _local(unquote(urlparse(url).path), settings)
    elif scheme == "":
        data = _local(url, settings)
    else:
        raise OvqError(f"image URL scheme {scheme!r} is not supported", param=PARAM)
    return check_image(data, settings)
