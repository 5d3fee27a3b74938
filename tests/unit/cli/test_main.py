"""`ovq --version` prints the installed distribution's version, which pyproject.toml alone sets; a stop signal while
`ovq` starts ends it with exit 0 and one line."""
from __future__ import annotations

import re
import subprocess
import sys
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


# A stop signal handled where CI's landed: inside a class body's __set_name__, as rich's dataclasses run on import.
_STOP_DURING_SET_NAME = """
import os, signal, time
from cli.main import _stopped
signal.signal(signal.SIGTERM, _stopped)

class Field:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

class Column:
    cells = Field()

print("not stopped")
"""


def test_a_stop_signal_during_an_import_exits_0_with_one_line() -> None:
    done = subprocess.run([sys.executable, "-c", _STOP_DURING_SET_NAME], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    assert done.stderr.strip() == "ovq: SIGTERM before the command started: exiting"
