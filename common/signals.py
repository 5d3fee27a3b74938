"""Stop signals while a tier starts (the API, a worker): neither lost nor a crash (see `EarlySignals`)."""
from __future__ import annotations

import os
import signal
import threading
import time


class Stopping(BaseException):
    """SIGTERM or SIGINT while the tier is still starting (importing, waiting for Redis, preparing its model): not an
    error, the end."""


class EarlySignals:
    """SIGTERM and SIGINT until the tier's event loop has installed its own handlers (uvicorn's; a worker's in
    `Worker.run`). Before `hand_over` a signal ends the start at once (`Stopping`); after it, until those handlers
    are in, a signal is remembered and handed to them as soon as they are in place, so the tier drains as for any
    stop (the default handler would kill the process mid start, a no-op would lose the signal). Once uvicorn drains
    it re-raises the signal to us: then it is the end."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.raising = True

    def __call__(self, signum: int, _frame: object) -> None:
        self.pending = self.pending or signum
        if self.raising:
            raise Stopping(signal.Signals(signum).name)

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self)

    def hand_over(self) -> None:
        """From now on remember, and forward what comes to the loop's handlers once they have taken the signals."""
        self.raising = False
        threading.Thread(target=self._forward, name="early-signals", daemon=True).start()

    def _forward(self) -> None:
        while signal.getsignal(signal.SIGTERM) is self:
            time.sleep(0.05)
        if self.pending is not None:
            os.kill(os.getpid(), self.pending)
