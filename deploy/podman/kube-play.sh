#!/usr/bin/env bash
# Runs deploy/kubernetes/ under `podman kube play` as far as it goes (kube_play.py adapts and says what it leaves
# out), on a network of the run's own, with the Secret ovq-api-keys made for the run (podman secret) and the
# models claim filled from this machine's prepared model (the init container's `ovq models prepare` is then a
# no-op: nothing fetched). Checks that the API answers a chat on 127.0.0.1:8000 (OVQ_KUBE_API_PORT), then takes it
# all down unless --keep. Usage: deploy/podman/kube-play.sh [--keep]   (python3: one with ovq installed, or PYTHON=...)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/env.sh"
. "$here/turns.sh"
take_turns kube-play "$@"
keep=${1:-}
python=${PYTHON:-python3}
network=ovq-kube
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -n 1)
podman image exists "ovq:$version" || "$here/build-image.sh" "ovq:$version"
"$here/redis-image.sh"

work=$(mktemp -d "${TMPDIR:-/var/tmp}/ovq-kube.XXXXXX")
"$python" "$here/kube_play.py" "$work" ovq-models
# Whatever `kube down` leaves (a pod caught restarting its init container) goes by force: a pod left behind would
# stop the next run's play ("pod already exists"), as it once stopped CI's.
pods() { podman pod ps -q --filter "network=$network" 2>/dev/null || true; }
down() {
  while read -r file _; do podman kube down "$work/$file" >/dev/null 2>&1 || true; done <"$work/plan.txt"
  pods | xargs -r podman pod rm -f -t 10 >/dev/null 2>&1 || true
  podman volume rm -f ovq-models data >/dev/null 2>&1 || true
  podman secret rm ovq-api-keys >/dev/null 2>&1 || true
  podman network rm -f "$network" >/dev/null 2>&1 || true
  rm -rf "$work"
}
[ -n "$keep" ] || trap down EXIT
# An earlier run killed before its own `down` (or one started with --keep) would make this one's creates fail.
pods | xargs -r podman pod rm -f -t 10 >/dev/null 2>&1 || true
podman secret rm ovq-api-keys >/dev/null 2>&1 || true
podman volume rm -f ovq-models data >/dev/null 2>&1 || true

# The Secret as podman 4.3's secretKeyRef reads it: JSON, each key's value base64.
key="sk-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
"$python" -c "import base64, json, sys; print(json.dumps({k: base64.b64encode(v.encode()).decode()
  for k, v in (('api-keys', sys.argv[1]), ('admin-keys', 'adm-' + sys.argv[1][3:]))}))" "$key" >"$work/secret.json"
podman secret create ovq-api-keys "$work/secret.json" >/dev/null
rm "$work/secret.json"
podman network exists "$network" || podman network create "$network" >/dev/null

prepared=$(cd "$repo" && "$python" -c "
from common.models.prepare import prepare
from common.models.sources import default_model
from common.settings import Settings
print(prepare(default_model(Settings())))" | tail -n 1)
podman volume create ovq-models >/dev/null
podman run --rm --network none --user 0 -v ovq-models:/cache/models -v "$prepared:/src:ro" "ovq:$version" \
  sh -c "cp -a /src /cache/models/$(basename "$prepared") && chown -R 10001:0 /cache/models"

start=$(date +%s)
while read -r file alias; do
  net=$network
  [ "$alias" = - ] || net="$network:alias=$alias"
  podman kube play --replace --network "$net" --configmap "$repo/deploy/kubernetes/config.yaml" "$work/$file" >/dev/null
  echo "kube-play: $file played$([ "$alias" = - ] || echo " (as $alias)")"
done <"$work/plan.txt"

deadline=$(( $(date +%s) + ${OVQ_FLEET_WAIT_S:-600} ))
until answer=$(curl -sf -m 60 "http://127.0.0.1:${OVQ_KUBE_API_PORT:-8000}/v3/chat/completions" -H "Authorization: Bearer $key" \
    -H 'Content-Type: application/json' \
    -d '{"model": "smollm2-135m-instruct", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}'); do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "kube-play: the API did not answer"; podman ps -a; exit 1; }
  sleep 2
done
echo "kube-play: the API answered in $(( $(date +%s) - start )) s: $answer"
podman ps -a --format '{{.Names}} {{.Status}}' | grep -v -e '-infra ' | sed 's/^/kube-play: /'
[ -z "$keep" ] || echo "kube-play: left running (files in $work)"
