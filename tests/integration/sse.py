"""SSE lines as the protocol splits them: at line feeds only.

httpx's `iter_lines` splits like `str.splitlines`, also at U+2028, U+2029 and U+0085, which orjson leaves
unescaped inside a JSON string (correctly: JSON and SSE allow them). A random-weight model generates them, and a
frame cut there parses as broken JSON, a failure of the test client, not of the stream."""
from __future__ import annotations

from collections.abc import Iterator

import httpx


def lines(response: httpx.Response) -> Iterator[str]:
    pending = ""
    for text in response.iter_text():
        pending += text
        *complete, pending = pending.split("\n")
        for line in complete:
            yield line.removesuffix("\r")
    if pending:
        yield pending
