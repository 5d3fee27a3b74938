#!/usr/bin/env bash
# Tags a Redis image as deploy/compose.yaml names it: pulled where a registry serves it, else built from Debian's
# redis-server and redis-sentinel on the base build-image.sh uses (redis.Containerfile). Usage: redis-image.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
tag=$(sed -n 's/^ *image: \(redis:[^ ]*\)$/\1/p' "$here/../compose.yaml" | head -n 1)
base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$here/../Dockerfile")
if podman image exists "$tag" || podman pull -q "$tag" >/dev/null 2>&1; then
  echo "redis-image: $tag"
  exit 0
fi
if ! podman image exists "$base" && ! podman pull -q "$base" >/dev/null 2>&1; then
  "$here/debian-base.sh" "$base"
fi
podman build --format docker -q -f "$here/redis.Containerfile" --build-arg "BASE=$base" -t "$tag" "$here" >/dev/null
echo "redis-image: $tag built from Debian's $(podman run --rm --network none "$tag" redis-server --version | cut -d' ' -f1-3)"
