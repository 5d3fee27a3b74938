"""Server-sent events as the chaos client reads them: (id, event name, data) per event, from an httpx stream."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx


@dataclass
class Event:
    id: str | None
    name: str | None
    data: str


async def events(response: httpx.Response) -> AsyncIterator[Event]:
    """Each event of the response; comments (`: ping`) are skipped. Ends when the server closes the stream."""
    fields: dict[str, str] = {}
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield Event(fields.get("id"), fields.get("event"), "\n".join(data))
            fields, data = {}, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                fields[name] = value
