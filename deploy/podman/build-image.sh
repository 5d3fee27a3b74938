#!/usr/bin/env bash
# Builds deploy/Dockerfile with podman where no container registry may be reachable:
#  1. the base image the Dockerfile names (PYTHON_IMAGE): used if present, else pulled, else built from this
#     machine's Debian archive (debian-base.sh);
#  2. the image, from a clean copy of the tree (git archive of the working tree's tracked files: nothing
#     untracked, no build/ or *.egg-info, no deploy/secrets), with this machine's pip settings as build secrets
#     (pip.conf and its CA file; never in a layer).
# Usage: deploy/podman/build-image.sh [TAG]   (default ovq:VERSION from pyproject.toml)
# Environment: OPENVINO_DEVICES (device plugins kept, default "CPU GPU NPU"), MODELS_FILE (models baked in).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/env.sh"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -n 1)
tag=${1:-ovq:$version}

base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$repo/deploy/Dockerfile")
if ! podman image exists "$base" && ! podman pull -q "$base" >/dev/null 2>&1; then
  echo "build-image: $base cannot be pulled; building it from this machine's Debian archive"
  "$here/debian-base.sh" "$base"
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/ovq-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
# `git stash create` makes a commit of the working tree's tracked changes without touching the stash (nothing
# when the tree is clean): the image is what `git diff HEAD` shows, not only what is committed.
revision=$(git -C "$repo" stash create 2>/dev/null || true)
revision=${revision:-$(git -C "$repo" rev-parse HEAD)}
mkdir "$work/context"
git -C "$repo" archive "$revision" | tar -x -C "$work/context"

# pip's settings on this machine, passed as secrets: an index (http(s) only: a file:// index is not in the
# build), and the CA bundle pip trusts here (a TLS-inspecting proxy's, say).
pip_get() { python3 -m pip config get "global.$1" 2>/dev/null | grep -v '^$' || true; }
cert=${PIP_CERT:-$(pip_get cert)}
cert=${cert:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}
index=${PIP_INDEX_URL:-$(pip_get index-url)}
extra=$(printf '%s\n' ${PIP_EXTRA_INDEX_URL:-$(pip_get extra-index-url)} | grep -E '^https?://' | tr '\n' ' ' || true)
secrets=()
(umask 077; echo "[global]" >"$work/pip.conf")
if [ -n "$cert" ] && [ -f "$cert" ]; then
  echo "cert = /run/secrets/pip-ca" >>"$work/pip.conf"
  secrets+=(--secret "id=pip-ca,src=$cert")
fi
case "$index" in http://* | https://*) echo "index-url = $index" >>"$work/pip.conf" ;; esac
[ -z "${extra// /}" ] || echo "extra-index-url = $extra" >>"$work/pip.conf"
secrets+=(--secret "id=pip.conf,src=$work/pip.conf")

# --format docker keeps HEALTHCHECK and SHELL (OCI images have neither).
podman build --format docker --layers -f deploy/Dockerfile -t "$tag" "${secrets[@]}" \
  --build-arg "OVQ_REVISION=$revision" \
  --build-arg "OPENVINO_DEVICES=${OPENVINO_DEVICES:-CPU GPU NPU}" \
  --build-arg "MODELS_FILE=${MODELS_FILE:-}" \
  "$work/context"
echo "build-image: $tag ($(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"
