"""The one line that says what `ovq serve` is doing while it starts: a spinner that rewrites itself on a
terminal, else a plain line each time the step changes (and every PLAIN_REPEAT_S while one lasts), so a log file
shows the steps without a line per poll.

It goes to stderr, as every other line of `ovq serve` does, so stderr is the stream whose being a terminal
decides. Lines printed meanwhile (`say`: `ovq serve`'s own, its children's) appear above the spinner."""
from __future__ import annotations

import sys
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

PLAIN_REPEAT_S = 30.0

# One writer at a time: `ovq serve`'s own lines and its children's, which reader threads pass on.
_lock = threading.Lock()
_live: Live | None = None


def say(line: str) -> None:
    """Write one line whole: above the spinner while one runs (as text: a child's `[...]` is not markup)."""
    with _lock:
        if _live is not None:
            _live.console.print(Text(line.rstrip("\n")), soft_wrap=True)
            return
        sys.stderr.write(line if line.endswith("\n") else line + "\n")
        sys.stderr.flush()


class Progress:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tty = sys.stderr.isatty()
        self._spinner: Spinner | None = None
        self._shown = ""
        self._shown_at = 0.0

    def update(self, step: str, elapsed_s: float | None = None) -> None:
        """Show `step` (what is being waited for); `elapsed_s`, how long it has lasted, shows on a terminal and on
        the plain line's repeats."""
        line = f"{self.prefix}: {step}"
        if self.tty:
            self._spin(Text(line if elapsed_s is None else f"{line} ({elapsed_s:.0f}s)"))
            return
        now = time.monotonic()
        if step != self._shown:
            self._shown, self._shown_at = step, now
            say(line)
        elif now - self._shown_at >= PLAIN_REPEAT_S:
            self._shown_at = now
            say(line if elapsed_s is None else f"{line} ({elapsed_s:.0f}s)")

    def _spin(self, text: Text) -> None:
        global _live
        if self._spinner is not None:
            self._spinner.update(text=text)
            return
        self._spinner = Spinner("dots", text=text)
        # No redirection of sys.stderr: lines come through `say`, which prints them as text, never as markup.
        live = Live(self._spinner, console=Console(stderr=True), transient=True, refresh_per_second=8,
                    redirect_stdout=False, redirect_stderr=False)
        live.start()
        with _lock:
            _live = live

    def close(self) -> None:
        """Take the spinner away (the lines printed meanwhile stay)."""
        global _live
        with _lock:
            live, _live = _live, None
        if live is not None:
            live.stop()
        self._spinner = None
        self._shown = ""
