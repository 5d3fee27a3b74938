"""The progress line of `ovq serve`: plain lines where stderr is not a terminal, a spinner where it is."""
from __future__ import annotations

import io

import pytest

from cli import progress
from cli.progress import Progress, say


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_once_per_step_and_again_while_a_step_lasts(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    line = Progress("ovq serve")
    line.update("loading m on CPU, API starting", 0.1)
    line.update("loading m on CPU, API starting", 0.3)
    line.update("loading m on CPU", 0.5)
    monkeypatch.setattr(progress, "PLAIN_REPEAT_S", 0.0)
    line.update("loading m on CPU", 31)
    line.close()
    assert capsys.readouterr().err.splitlines() == [
        "ovq serve: loading m on CPU, API starting", "ovq serve: loading m on CPU",
        "ovq serve: loading m on CPU (31s)"]


def test_on_a_terminal_a_spinner_with_lines_said_above_it_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    line = Progress("ovq serve")
    line.update("loading m on CPU", 2)
    say("a child's line [/not markup]")
    line.update("loading m on CPU", 3)
    line.close()
    say("after")
    out = terminal.getvalue()
    assert "ovq serve: loading m on CPU (2s)" in out
    assert "a child's line [/not markup]\n" in out
    assert out.endswith("after\n")
