"""`--ovms-config` and OVMS's own spellings of ovq's options, shared by the commands that read the models.

An OVMS command line (`--config_path`, `--rest_port`, `--rest_bind_address`, `--log_level`,
`--allowed_local_media_path`) works unchanged; docs/how-to/ovms-repository.md ("OVMS's command line") lists what
maps and what has no meaning for a queue-based server.
"""
from __future__ import annotations

import argparse
import os
import sys

from common.models.config import ConfigError, ModelConfig
from common.models.sources import configured_models
from common.settings import Settings

# OVMS's levels; ovq's tiers log with Python's and uvicorn's, which have no TRACE.
_LOG_LEVELS = {"TRACE": "debug", "DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error"}


def _log_level(value: str) -> str:
    if value.upper() not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"one of {', '.join(_LOG_LEVELS)}")
    return _LOG_LEVELS[value.upper()]


def add_arguments(parser: argparse.ArgumentParser, server: bool = False, tier: bool = True) -> None:
    """`server`: the command runs the API (port, bind address, media path); `tier`: it runs a tier (log level)."""
    parser.add_argument("--ovms-config", "--config_path", dest="ovms_config", metavar="PATH/config.json",
                        help="an OVMS repository's config.json (or its directory), served as is; not with --config")
    if tier:
        parser.add_argument("--log_level", type=_log_level, help="OVMS's spelling of OVQ_LOG_LEVEL")
    if server:
        parser.add_argument("--rest_port", dest="port", type=int, help="OVMS's spelling of --port")
        parser.add_argument("--rest_bind_address", dest="host", help="OVMS's spelling of --host")
        parser.add_argument("--allowed_local_media_path", help="OVMS's spelling of OVQ_ALLOWED_LOCAL_MEDIA_PATH")


def env(args: argparse.Namespace) -> dict[str, str]:
    """The settings these options carry to the tiers, as environment variables."""
    values = {}
    if getattr(args, "ovms_config", None):
        values["OVQ_OVMS_CONFIG"] = os.path.abspath(args.ovms_config)
    if getattr(args, "log_level", None):
        values["OVQ_LOG_LEVEL"] = args.log_level
    if getattr(args, "allowed_local_media_path", None):
        values["OVQ_ALLOWED_LOCAL_MEDIA_PATH"] = os.path.abspath(args.allowed_local_media_path)
    return values


def checked_models(settings: Settings, command: str) -> list[ModelConfig] | None:
    """The configured models, with the OVMS import's warnings shown; None after one line saying why they
    cannot be served (the command then exits with 2)."""
    try:
        return configured_models(settings, warn=lambda w: print(f"{command}: warning: {w}", file=sys.stderr))
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
