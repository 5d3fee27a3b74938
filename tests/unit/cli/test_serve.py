"""`ovq serve`'s children: what a failed one said last."""
from __future__ import annotations

import os
import sys

import pytest

from cli.serve import Child


def python(code: str) -> Child:
    return Child("child", [sys.executable, "-c", code], dict(os.environ))


def exited(code: str) -> Child:
    child = python(code)
    child.start()
    assert child.process is not None
    child.process.wait(30)
    return child


def test_a_child_that_exits_is_described_by_its_code_and_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    child = exited("import sys; print('loading'); print('out of memory', file=sys.stderr); print(); sys.exit(3)")
    assert child.exit_reason() == "exited with code 3: out of memory"
    assert capsys.readouterr().err.splitlines() == ["loading", "out of memory", ""]  # passed on


def test_its_last_error_line_is_preferred_to_the_lines_of_its_shutdown() -> None:
    child = exited("import sys; print('INFO: started'); print('ERROR: [Errno 98] address already in use'); "
                   "print('INFO: Application shutdown complete.'); sys.exit(3)")
    assert child.exit_reason() == "exited with code 3: ERROR: [Errno 98] address already in use"
    child = exited("import sys; print('ovq worker: device X unavailable for m: not registered'); "
                   "print('exiting'); sys.exit(1)")
    assert child.exit_reason() == "exited with code 1: ovq worker: device X unavailable for m: not registered"
