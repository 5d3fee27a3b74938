#!/usr/bin/env bash
# Runs deploy/compose.yaml's fleet under podman-compose (compose_fleet.py derives it: two APIs on 127.0.0.1:8000
# and :8001 (OVQ_FLEET_API_PORTS="A B" for others), two workers, the batch worker, Redis; --sentinel adds the
# replica and three sentinels), checks that each API answers and a batch completes, then takes it down (volumes
# included) unless --keep.
# The models volume is filled from this machine's prepared model first, so `prepare` is a no-op and no container
# needs to reach anything outside the project's network. Needs podman-compose (pip install podman-compose).
# Usage: deploy/podman/compose-fleet.sh [--sentinel] [--keep]   (python3: one with ovq installed, or PYTHON=...)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/env.sh"
. "$here/turns.sh"
take_turns compose-fleet "$@"
sentinel="" keep=""
for arg in "$@"; do
  case "$arg" in --sentinel) sentinel=--sentinel ;; --keep) keep=1 ;; *) echo "unknown: $arg" >&2; exit 2 ;; esac
done
command -v podman-compose >/dev/null || { echo "compose-fleet: podman-compose is not installed (pip install podman-compose)"; exit 2; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -n 1)
podman image exists "ovq:$version" || "$here/build-image.sh" "ovq:$version"
"$here/redis-image.sh"

work=$(mktemp -d "${TMPDIR:-/var/tmp}/ovq-fleet.XXXXXX")
# shellcheck disable=SC2086 # two port numbers
"${PYTHON:-python3}" "$here/compose_fleet.py" write "$work" $sentinel --api-ports ${OVQ_FLEET_API_PORTS:-8000 8001}
compose() { podman-compose -f "$work/compose.yaml" "$@"; }
# What `compose down` leaves goes by force, and so does an earlier run's (one killed before its own `down`, or
# started with --keep): a container or volume left behind would make this run's creates fail.
leftovers() {
  podman ps -aq --filter label=io.podman.compose.project=ovq-fleet | xargs -r podman rm -f -t 10 >/dev/null 2>&1 || true
  podman volume ls -q --filter label=io.podman.compose.project=ovq-fleet | xargs -r podman volume rm -f >/dev/null 2>&1 || true
  podman volume rm -f ovq-fleet_models >/dev/null 2>&1 || true
}
down() {
  compose down -v -t 45 >/dev/null 2>&1 || true
  leftovers
  rm -rf "$work"
}
[ -n "$keep" ] || trap down EXIT
leftovers

model=$(sed -n '0,/^  \([a-z0-9.-]*\):$/s//\1/p' "$repo/deploy/models.yaml" | head -n 1)
prepared=$(cd "$repo" && "${PYTHON:-python3}" -c "
from common.models.prepare import prepare
from common.models.sources import default_model
from common.settings import Settings
print(prepare(default_model(Settings())))" | tail -n 1)
podman volume create ovq-fleet_models >/dev/null
podman run --rm --network none --user 0 -v ovq-fleet_models:/cache/models -v "$prepared:/src:ro" "ovq:$version" \
  sh -c "cp -a /src /cache/models/$model && chown -R 10001:0 /cache/models"

start=$(date +%s)
compose up -d 2>&1 | grep -v -e 'level=error' -e '^[0-9a-f]\{64\}$' || true
"${PYTHON:-python3}" "$here/compose_fleet.py" check "$work"
echo "compose-fleet: up and answering in $(( $(date +%s) - start )) s"
unhealthy=0
for name in $(podman ps --filter label=io.podman.compose.project=ovq-fleet --format '{{.Names}}' | sort); do
  if podman inspect --format '{{.Config.Healthcheck}}' "$name" | grep -q '\[CMD'; then
    # A worker is ready once its model is loaded: a few tries, 5 s apart (a chat was answered by one already).
    tries=0
    until podman healthcheck run "$name" >/dev/null 2>&1 || [ $((tries += 1)) -ge 24 ]; do sleep 5; done
    if [ "$tries" -lt 24 ]; then echo "compose-fleet: $name healthy"
    else echo "compose-fleet: $name UNHEALTHY"; unhealthy=1; fi
  fi
done
prepared_rc=$(podman inspect --format '{{.State.ExitCode}}' ovq-fleet_prepare_1)
echo "compose-fleet: prepare exited $prepared_rc"
[ -z "$keep" ] || echo "compose-fleet: left running: podman-compose -f $work/compose.yaml down -v"
[ "$unhealthy$prepared_rc" = 00 ]
