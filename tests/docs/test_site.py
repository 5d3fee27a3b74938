"""The documentation site builds with `mkdocs build --strict` (no broken link or anchor, no page outside the
navigation), and the README stays the short entry point: the two commands first, at most 150 lines."""
from __future__ import annotations

from tests.conftest import ROOT

COMMANDS = ["    pip install -e . && ovq serve",
            "    pip install -q -e '.[test]' && python -m pytest -q -p no:cacheprovider"]


def test_the_site_builds_strictly(site) -> None:
    assert site.returncode == 0, f"mkdocs build --strict failed:\n{site.log[-4000:]}"
    assert (site.path / "index.html").is_file() and (site.path / "search" / "search_index.json").is_file()


def test_the_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[:2] == COMMANDS
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the detail into docs/"
    assert COMMANDS[1].strip() in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"
