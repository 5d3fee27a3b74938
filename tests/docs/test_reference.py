"""The generated reference pages (settings, CLI, metrics, Redis keys) are what `python docs/gen_reference.py` writes
from today's code, and every setting says what it does."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PAGES = ("settings.md", "cli.md", "metrics.md", "redis-keys.md")


def test_the_generated_reference_pages_are_current(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stale = [name for name in PAGES
             if (tmp_path / name).read_text() != (ROOT / "docs" / "reference" / name).read_text()]
    assert not stale, f"stale: docs/reference/{', '.join(stale)}; run `python docs/gen_reference.py` and commit them"


def _silent(page: str) -> tuple[list[str], list[str]]:
    """(rows, first cells of the rows whose last cell is empty) of a generated page's tables."""
    rows = [line for line in (ROOT / "docs" / "reference" / page).read_text().splitlines() if line.startswith("| `")]
    cells = [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]  # escaped \| stays
    return rows, [row[0] for row in cells if not row[-1]]


def test_every_setting_says_what_it_does() -> None:
    rows, silent = _silent("settings.md")
    assert rows and not silent, f"settings without a comment above them in common/settings.py: {silent}"


def test_every_cli_argument_says_what_it_does() -> None:
    rows, silent = _silent("cli.md")
    assert rows and not silent, f"arguments without help= in cli/: {silent}"
