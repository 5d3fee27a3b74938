"""`python -m api`: the HTTP front on OVQ_HOST:OVQ_PORT, in OVQ_API_PROCESSES processes sharing the port."""
from __future__ import annotations

import sys

from api.http.signals import EarlySignals, Stopping


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


if __name__ == "__main__":
    sys.exit(main())
