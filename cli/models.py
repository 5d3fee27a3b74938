"""`ovq models prepare`: download and convert models to OpenVINO IR once."""
from __future__ import annotations

import argparse

from cli.tiers import config_env
from common.config import configured_models
from common.settings import Settings


def prepare_models(args: argparse.Namespace) -> int:
    from workers.prepare import prepare

    settings = Settings(**{"config": config_env(args)["OVQ_CONFIG"]} if args.config else {})
    for model in configured_models(settings):
        if args.model in (None, model.name):
            print(f"{model.name}: {prepare(model)}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="model management").add_subparsers(dest="action", required=True)
    p = models.add_parser("prepare", help="download and convert models to OpenVINO IR")
    p.add_argument("--config", help="models file (YAML or JSON)")
    p.add_argument("--model")
    p.set_defaults(func=prepare_models)
