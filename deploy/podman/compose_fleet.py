"""The fleet of deploy/compose.yaml on one host under podman-compose, derived from that file without changing it:
two APIs (`api` and a copy, `api-2`: podman cannot give replicas of one service different host ports from a range
as Docker does), `--scale worker=2`, the batch worker, Redis, and with `--sentinel` the file's `sentinel` profile
(a replica and three sentinels; every tier then takes REDIS_URL=redis+sentinel://...). Ports are published on
127.0.0.1 only; the containers talk over the project's own network. Keys are made for the run, outside the tree.

    python deploy/podman/compose_fleet.py write DIR [--sentinel]   # DIR/compose.yaml and DIR/secrets/
    python deploy/podman/compose_fleet.py check DIR                # each API answers a chat and runs a batch
"""
from __future__ import annotations

import argparse
import copy
import io
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

DEPLOY = Path(__file__).resolve().parent.parent
FLEET = ("redis", "prepare", "api", "worker", "batch")
SENTINEL = ("redis-replica", "sentinel-1", "sentinel-2", "sentinel-3")
SENTINEL_URL = "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/ovq/0"
WAIT_S = float(os.environ.get("OVQ_FLEET_WAIT_S", "600"))  # for the fleet to answer, and again for the batch


def _absolute(volume: str) -> str:
    """`./x:/y` relative to deploy/ (where compose.yaml lives) made absolute, as the derived file lives elsewhere."""
    return str(DEPLOY / volume[2:]) if volume.startswith("./") else volume


def _loopback(port: str, host_port: int | None = None) -> str:
    """`8000:8000` published on 127.0.0.1 only (and on another host port where given)."""
    parts = str(port).split(":")
    target = parts[-1]
    published = str(host_port) if host_port else parts[-2]
    return f"127.0.0.1:{published}:{target}"


def derive(sentinel: bool, api_ports: tuple[int, int]) -> dict[str, Any]:
    source = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    names = FLEET + (SENTINEL if sentinel else ())
    services = {name: copy.deepcopy(source["services"][name]) for name in names}
    for service in services.values():
        service.pop("build", None)  # images are built beforehand (build-image.sh, redis-image.sh)
        service["volumes"] = [_absolute(v) for v in service.get("volumes", [])]
        service.pop("profiles", None)  # chosen here already
        if sentinel and "REDIS_URL" in service.get("environment", {}):
            service["environment"]["REDIS_URL"] = SENTINEL_URL
    services["api-2"] = copy.deepcopy(services["api"])
    services["batch"]["depends_on"]["api-2"] = {"condition": "service_healthy"}
    for name, port in zip(("api", "api-2"), api_ports, strict=True):
        services[name]["ports"] = [_loopback(p, port) for p in services[name]["ports"]]
    services["worker"]["scale"] = 2
    used = {v.split(":")[0] for s in services.values() for v in s["volumes"] if not v.startswith("/")}
    return {"name": "ovq-fleet", "services": services,
            "secrets": {name: {"file": f"./secrets/{Path(spec['file']).name}"}
                        for name, spec in source["secrets"].items()},
            "volumes": {name: spec for name, spec in source["volumes"].items() if name in used}}


def write(directory: Path, sentinel: bool, api_ports: tuple[int, int]) -> None:
    keys = directory / "secrets"
    keys.mkdir(parents=True, exist_ok=True)
    (keys / "api-keys").write_text(f"sk-{secrets.token_hex(16)}\n")
    (keys / "admin-key").write_text(f"adm-{secrets.token_hex(16)}\n")
    for path in keys.iterdir():
        path.chmod(0o644)  # read by the containers' user (10001); the directory is the run's own
    (directory / "compose.yaml").write_text(yaml.safe_dump(derive(sentinel, api_ports), sort_keys=False))


def _until(what: str, timeout_s: float, attempt: Any) -> Any:
    """attempt() until it returns something true (transport errors and 5xx are retried), at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = attempt()
            if result:
                return result
        except (httpx.TransportError, httpx.HTTPStatusError) as error:
            last = error
        time.sleep(2)
    raise SystemExit(f"compose_fleet: {what}: not within {timeout_s:.0f} s ({last})")


def check(directory: Path) -> None:
    """Each published API answers a chat; a two-line batch sent through the first completes (the batch worker
    runs it against the APIs, the workers answer it)."""
    fleet = yaml.safe_load((directory / "compose.yaml").read_text())
    key = (directory / "secrets" / "api-keys").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    model = next(iter(yaml.safe_load((DEPLOY / "models.yaml").read_text())["models"]))
    bases = [f"http://{fleet['services'][name]['ports'][0].rsplit(':', 1)[0]}" for name in ("api", "api-2")]
    chat = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    started = time.monotonic()
    for base in bases:
        def answer(base: str = base) -> str:
            response = httpx.post(f"{base}/v3/chat/completions", json=chat, headers=headers, timeout=60)
            response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"] or " "
        print(f"compose_fleet: {base} answered {_until(f'{base} answering', WAIT_S, answer)!r} "
              f"at {time.monotonic() - started:.1f} s")
    lines = "".join(json.dumps({"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                                "body": chat}) + "\n" for n in range(2))
    uploaded = httpx.post(f"{bases[0]}/v1/files", headers=headers, timeout=60, data={"purpose": "batch"},
                          files={"file": ("fleet.jsonl", io.BytesIO(lines.encode()))})
    uploaded.raise_for_status()
    batch = httpx.post(f"{bases[0]}/v1/batches", headers=headers, timeout=60,
                       json={"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
                             "completion_window": "24h"})
    batch.raise_for_status()

    def finished() -> dict[str, Any] | None:
        state = httpx.get(f"{bases[1]}/v1/batches/{batch.json()['id']}", headers=headers, timeout=30).json()
        return state if state["status"] in ("completed", "failed", "expired", "cancelled") else None
    state = _until("the batch finishing", WAIT_S, finished)
    if state["status"] != "completed" or state["request_counts"]["completed"] != 2:
        raise SystemExit(f"compose_fleet: the batch ended {state['status']}: {state['request_counts']}")
    print(f"compose_fleet: a batch of 2 lines completed at {time.monotonic() - started:.1f} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["write", "check"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--sentinel", action="store_true")
    parser.add_argument("--api-ports", type=int, nargs=2, default=(8000, 8001))
    args = parser.parse_args(argv)
    if args.command == "write":
        write(args.directory, args.sentinel, tuple(args.api_ports))
    else:
        check(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
