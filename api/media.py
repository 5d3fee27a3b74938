"""Images in chat messages (`image_url` parts): fetched, checked and capped before a job is queued.

Accepted: `data:image/...;base64,` URLs; `http(s)` URLs whose host is exactly one of `allowed_media_domains`
(no redirects, size cap, timeout); `file://` or plain paths inside `allowed_local_media_path` (resolved, so no
`..` or symlink escape). Anything else, a file too large, or one that decodes to too many pixels is a 400.
"""
from __future__ import annotations

import base64
import binascii
import io
from urllib.parse import unquote, urlparse

import httpx
from PIL import Image

from common.errors import OvqError
from common.settings import Settings

PARAM = "messages"


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
    except Exception as exc:
        raise OvqError(f"{name} could not be read: {exc}", param=param) from exc
    return data


def _data_url(url: str) -> bytes:
    header, _, payload = url.partition(",")
    if not header.startswith("data:image/") or not header.endswith(";base64"):
        raise OvqError("image data URLs must be data:image/<type>;base64,...", param=PARAM)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OvqError(f"image data URL is not valid base64: {exc}", param=PARAM) from exc


def _local(path_text: str, settings: Settings) -> bytes:
    root = settings.allowed_local_media_path
    if root is None:
        raise OvqError("local image paths are not allowed on this server", param=PARAM)
    base = root.resolve()
    path = (base / path_text).resolve()
    if not path.is_relative_to(base):
        raise OvqError("image path is outside allowed_local_media_path", param=PARAM)
    if not path.is_file():
        raise OvqError(f"no image file at {path_text}", param=PARAM)
    if path.stat().st_size > settings.max_upload_bytes:
        raise OvqError(f"image is over {settings.max_upload_bytes} bytes", param=PARAM)
    return path.read_bytes()


async def _remote(url: str, settings: Settings) -> bytes:
    host = urlparse(url).hostname or ""
    if host not in settings.allowed_media_domains:
        raise OvqError(f"image host {host!r} is not in allowed_media_domains", param=PARAM)
    limit = settings.max_upload_bytes
    try:
        async with httpx.AsyncClient(follow_redirects=False, timeout=settings.media_timeout_s) as client:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise OvqError(f"fetching the image gave HTTP {response.status_code}", param=PARAM)
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise OvqError(f"image is over {limit} bytes", param=PARAM)
                    chunks.append(chunk)
                return b"".join(chunks)
    except httpx.HTTPError as exc:
        raise OvqError(f"could not fetch the image: {exc}", param=PARAM) from exc


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
