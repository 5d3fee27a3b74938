"""`--allow-unauthenticated` for `ovq api` and `ovq serve`: protected mode's way out, and serve's check before start.

An API on an address other than loopback with no API key refuses to start (`api.http.auth.exposure_refusal`);
the flag says an open API is meant. `ovq serve` checks first, so a refusal is one line, not a child restarted.
"""
from __future__ import annotations

import argparse

from api.http.auth import exposure_refusal, load_keys
from common.settings import Settings

SETTINGS = {"OVQ_HOST": "host", "OVQ_PORT": "port", "OVQ_API_KEYS": "api_keys", "OVQ_API_KEY_FILE": "api_key_file",
            "OVQ_ALLOW_UNAUTHENTICATED": "allow_unauthenticated"}


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve with no API key on an address other than loopback (OVQ_ALLOW_UNAUTHENTICATED); "
                        "without it, such an API refuses to start")


def env(args: argparse.Namespace) -> dict[str, str]:
    return {"OVQ_ALLOW_UNAUTHENTICATED": "1"} if getattr(args, "allow_unauthenticated", False) else {}


def refusal(api_env: dict[str, str]) -> str | None:
    """What the API started with `api_env` would refuse to serve with, if anything (key files must be readable)."""
    settings = Settings(**{name: api_env[var] for var, name in SETTINGS.items() if api_env.get(var)})
    return exposure_refusal(settings, load_keys(settings))
