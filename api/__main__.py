"""`python -m api`: the HTTP front on OVQ_HOST:OVQ_PORT."""
from __future__ import annotations

import uvicorn

from api.app import create_app
from common.settings import get_settings


def main() -> None:
    settings = get_settings()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                access_log=False, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
