"""`ovq models prepare`: download and convert models to OpenVINO IR once; `ovq models import-ovms`: an OVMS
repository as an ovq models file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli import ovms
from common.models.config import ConfigError
from common.models.ovms import load_ovms
from common.models.sources import dump_models
from common.settings import Settings


def prepare_models(args: argparse.Namespace) -> int:
    from common.models.prepare import prepare

    sources = {"config": args.config, "ovms_config": args.ovms_config}
    models = ovms.checked_models(Settings(**{k: v for k, v in sources.items() if v}), "ovq models prepare")
    if models is None:
        return 2
    for model in models:
        if args.model in (None, model.name):
            print(f"{model.name}: {prepare(model)}")
    return 0


def import_ovms(args: argparse.Namespace) -> int:
    """The equivalent models file on stdout: loading it gives the same models as serving the OVMS config."""
    try:
        imported = load_ovms(Path(args.path))
    except ConfigError as exc:
        print(f"ovq models import-ovms: {exc}", file=sys.stderr)
        return 2
    for warning in imported.warnings:
        print(f"ovq models import-ovms: warning: {warning}", file=sys.stderr)
    sys.stdout.write(f"# ovq models file, imported from the OVMS config {Path(args.path).absolute()}\n")
    sys.stdout.write(dump_models(imported.models))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="model management").add_subparsers(dest="action", required=True)
    p = models.add_parser("prepare", help="download and convert models to OpenVINO IR")
    p.add_argument("--config", help="models file (YAML or JSON)")
    ovms.add_arguments(p, tier=False)
    p.add_argument("--model", help="prepare only this model (default: every model configured)")
    p.set_defaults(func=prepare_models)
    p = models.add_parser("import-ovms", help="write the ovq models file (YAML) equivalent to an OVMS config")
    p.add_argument("path", metavar="PATH/config.json", help="an OVMS config.json, or the directory holding it")
    p.set_defaults(func=import_ovms)
