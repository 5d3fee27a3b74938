#!/usr/bin/env bash
# Builds a minimal Debian bookworm with Debian's Python 3.11 and pip from the Debian archive this machine's apt
# already uses, and imports it into podman as TAG: a stand-in for python:3.11-slim-bookworm where no container
# registry can be reached. Needs root (debootstrap). Usage: debian-base.sh TAG
set -euo pipefail
tag=${1:?usage: debian-base.sh TAG}
suite=bookworm
. "$(dirname "$0")/env.sh"

# The first Debian archive apt is configured with for the suite (deb822 .sources files, then sources.list).
mirror=$(awk -v suite="$suite" '
  /^[[:space:]]*$/ { if (deb && ok && uri) { print uri; exit } deb = ok = 0; uri = ""; next }
  /^Types:/ { deb = ($0 ~ /[[:space:]]deb([[:space:]]|$)/) }
  /^URIs:/ { uri = $2 }
  /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
  END { if (deb && ok && uri) print uri }' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | sed 's/\[[^]]*\]//' |
    awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2; exit }')
fi
[ -n "$mirror" ] || { echo "debian-base: no apt source for Debian $suite on this machine" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/var/tmp}/ovq-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
  "$suite" "$root" "$mirror" >"$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# As Debian's own images: no downloaded packages, lists, docs, man pages or translations; apt cleans up after
# itself; nothing of this machine (its resolver, its name). pip installs into the system Python, as in the
# python image (Debian marks it externally managed otherwise).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/etc/resolv.conf "$root"/etc/hostname "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED
cat >"$root"/etc/apt/apt.conf.d/docker-clean <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
CONF
tar --numeric-owner -C "$root" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
  --message "debootstrap --variant=minbase $suite + python3, python3-pip" - "$tag" >/dev/null
echo "debian-base: $tag from $mirror ($suite)"
