"""`python -m api`: the HTTP front on OVQ_HOST:OVQ_PORT, in OVQ_API_PROCESSES processes sharing the port."""
from __future__ import annotations

import signal
import sys

from common.signals import EarlySignals, Stopping


def main() -> int:
    signals = EarlySignals()
    signals.install()
    try:
        # Imported once the handler is in: FastAPI, pydantic and the app take a second or more to import, and a
        # stop signal in that time must end the start with exit 0, not kill it.
        from api.http.server import serve

        return serve(signals)
    except Stopping as stop:
        print(f"ovq api: {stop}: stopping before serving anything", file=sys.stderr)
        return 0
    except Exception:
        # A library that catches what it calls and re-raises its own error (pydantic wraps whatever interrupts its
        # schema building in a SchemaError) can turn `Stopping` into something else: a signal came, so it is still
        # the stop, not a crash.
        if signals.pending is None:
            raise
        name = signal.Signals(signals.pending).name
        print(f"ovq api: {name}: stopping before serving anything", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
