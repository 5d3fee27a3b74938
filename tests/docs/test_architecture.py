"""The architecture page is the design of record: every package under api/, workers/ and common/ has a row in its
capability table."""
from __future__ import annotations

import re

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "explanation" / "architecture.md"


def packages() -> list[str]:
    return sorted(f"{init.parent.relative_to(ROOT).as_posix()}/" for floor in ("api", "workers", "common")
                  for init in (ROOT / floor).rglob("__init__.py"))


def test_every_package_has_a_row_in_the_capability_table() -> None:
    rows = set(re.findall(r"^\| `([^`]+/)` \|", PAGE.read_text(), re.MULTILINE))
    missing = [package for package in packages() if package not in rows]
    assert "api/queue/" in packages() and not missing, \
        f"packages without a row in docs/explanation/architecture.md's capability table: {missing}"
