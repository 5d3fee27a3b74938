"""The fenced code blocks of the docs, and how each is checked (tests/docs/test_examples.py runs them).

A block's info string says what it is:

- `python`: run, in order with the page's other python blocks (one namespace per page, so a page reads like a
  session), in the page's own working directory, against the docs stack (`http://127.0.0.1:8000` is replaced by the
  stack's address);
- `bash`: run with `bash -euo pipefail` in the same directory (where `benchmarks/` is the repository's), with
  `REDIS_URL`, `OVQ_KEY_PREFIX` and `OVQ_PORT` of the stack, the same replacement, and this checkout's packages first
  on `PYTHONPATH`;
- `yaml`, `json`: parsed; a block titled `…models.yaml` is loaded as a models file, `…keys.yaml` as a key file;
- `text`, `mermaid`: output, pictures or file contents, not commands.

Any block with `title="PATH"` is also written to PATH (under the page's directory) before the blocks after it run,
so a page can build the files its commands read. An HTML comment on the line before a block,
`<!-- not-run: WHY -->`, leaves it unrun; WHY names what it needs that a test machine lacks (and, where one exists,
the test that covers it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN = {"python", "bash"}
PARSE = {"yaml", "json"}
OUTPUT = {"text", "mermaid"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<attrs>[^`]*)$")
TITLE = re.compile(r'title="([^"]+)"')
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<why>.+?)\s*-->\s*$")
BASE = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based, the opening fence
    lang: str
    title: str | None
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a Markdown page, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    row = 0
    while row < len(lines):
        opening = FENCE.match(lines[row])
        if not opening:
            row += 1
            continue
        indent = len(opening["indent"])
        end = next(i for i in range(row + 1, len(lines)) if lines[i].strip() == "```")
        code = "\n".join(text[indent:] for text in lines[row + 1:end]) + "\n"
        title = TITLE.search(opening["attrs"])
        marked = NOT_RUN.match(lines[row - 1]) if row else None
        found.append(Block(page, row + 1, opening["lang"], title[1] if title else None, code,
                           marked["why"] if marked else None))
        row = end + 1
    return found


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def runnable(page: Path) -> bool:
    """Whether a page has a block that is run or parsed."""
    return any(b.lang in RUN | PARSE and b.not_run is None for b in blocks(page))
