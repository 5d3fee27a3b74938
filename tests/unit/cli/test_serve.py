"""`ovq serve`'s children: what a failed one said last, and a stop that a lost SIGTERM does not hold up."""
from __future__ import annotations

import os
import sys
import time

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


def test_a_repeated_sigterm_stops_a_child_that_lost_the_first(tmp_path) -> None:
    ready = tmp_path / "ready"
    # Ignores the first SIGTERM (as the API does while it installs its handlers), exits on the second.
    child = python("import pathlib, signal, time\n"
                   "seen = []\n"
                   "signal.signal(signal.SIGTERM, lambda *_: seen.append(1) if not seen else exit(0))\n"
                   f"pathlib.Path({str(ready)!r}).touch()\n"
                   "while True: time.sleep(0.05)\n")
    child.start()
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.stop(30, repeat_s=0.2)
    assert child.process is not None
    assert child.process.returncode == 0  # stopped by its own handler, not killed
