"""`python -m workers --model NAME --device CPU`: one worker process for one model on one device; `--pool`: a pool
worker that serves any model of the models file on the device, loading what waits (workers/pool/)."""
from __future__ import annotations

import signal
import sys

from common.signals import EarlySignals, Stopping


def main() -> int:
    signals = EarlySignals()
    signals.install()
    try:
        # Imported once the handler is in: OpenVINO GenAI and the worker take seconds to import, the model to
        # prepare, and a stop signal in that time (a scale-in of a starting pod) must end the start with exit 0.
        from workers.start import main as start

        return start(signals)
    except Stopping as stop:
        print(f"ovq worker: {stop}: stopping before serving anything", file=sys.stderr)
        return 0
    except Exception:
        # A library that catches what it calls and re-raises its own error (a class body's __set_name__ wraps what
        # interrupts it in a RuntimeError) can turn `Stopping` into something else: a signal came, so it is the stop.
        # Once the worker runs (handed over), an error is the worker's own, whatever signal came.
        if signals.pending is None or not signals.raising:
            raise
        print(f"ovq worker: {signal.Signals(signals.pending).name}: stopping before serving anything", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
