"""deploy/podman's Python helpers, loaded from their files (deploy/ is not a package)."""
from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.deploy.conftest import DEPLOY


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"deploy_podman_{name}", DEPLOY / "podman" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
