"""`ovq --version` prints the installed distribution's version, which pyproject.toml alone sets."""
from __future__ import annotations

import re
from importlib.metadata import version

import pytest

from cli.main import parser
from tests.conftest import ROOT


def test_version_is_the_one_in_pyproject(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parser().parse_args(["--version"])
    assert done.value.code == 0
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)[1]
    assert capsys.readouterr().out.strip() == f"ovq {declared}" == f"ovq {version('ovq')}"
