#!/usr/bin/env bash
# The compose stack's base images built from Debian's packages, for a machine that reaches Debian's
# and PyPI's registries but no image registry (no Docker Hub):
#
#   traffic-debian:bookworm       debootstrap --variant=minbase bookworm, imported as an image
#   traffic-python:3.11-bookworm  Debian's Python 3.11 in a venv (stands in for python:3.11-slim-bookworm)
#   traffic-postgres:15-bookworm  Debian's postgresql-15 with the official image's entrypoint contract
#
#   sudo scripts/local-images.sh [--rebuild]
#
# An image already there is kept unless --rebuild. Then, in .env:
#   TRAFFIC_BASE_IMAGE=traffic-python:3.11-bookworm
#   POSTGRES_IMAGE=traffic-postgres:15-bookworm
# Needs root (debootstrap) and a running Docker engine. Builds use the host's network to reach apt.
# DEBIAN_MIRROR overrides the mirror (default: the first one this host's apt uses, else deb.debian.org);
# DEBIAN_SECURITY_MIRROR the security archive (empty: none); HOST_CA_BUNDLE the certificate authorities
# the Python base trusts for pip (default this host's bundle, so a TLS proxy the host trusts works there too).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
debian_image=${LOCAL_DEBIAN_IMAGE:-traffic-debian:bookworm}
python_image=${LOCAL_PYTHON_IMAGE:-traffic-python:3.11-bookworm}
postgres_image=${LOCAL_POSTGRES_IMAGE:-traffic-postgres:15-bookworm}
rebuild=0
case "${1:-}" in
  --rebuild) rebuild=1 ;;
  "") ;;
  *) echo "usage: $0 [--rebuild]" >&2; exit 2 ;;
esac

say() { printf '[local-images] %s\n' "$*"; }
have() { [ "$rebuild" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }

host_mirror() {  # the first Debian archive this host's apt reads (deb822 or one-line sources)
  { grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' || true
  } | grep -v -- '-security' | head -n 1 || true
}
mirror=${DEBIAN_MIRROR:-$(host_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR-http://deb.debian.org/debian-security}

command -v docker >/dev/null || { echo "local-images: no docker command (apt-get install docker.io)" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "local-images: no Docker engine answers (start dockerd)" >&2; exit 1; }

if have "$debian_image"; then
  say "$debian_image: there already"
else
  command -v debootstrap >/dev/null || { echo "local-images: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "local-images: debootstrap needs root" >&2; exit 1; }
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/traffic-rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  say "$debian_image: debootstrap --variant=minbase bookworm from $mirror"
  started=$SECONDS
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 \
    || { tail -n 20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
  rm -f "$rootfs.log"
  {
    echo "deb $mirror bookworm main"
    echo "deb $mirror bookworm-updates main"
    [ -z "$security" ] || echo "deb $security bookworm-security main"
  } > "$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import - "$debian_image" >/dev/null
  rm -rf "$rootfs"; trap - EXIT
  say "$debian_image: imported in $((SECONDS - started)) s"
fi

build() {  # build <image> <Dockerfile under docker/>
  if have "$1"; then say "$1: there already"; return; fi
  say "$1: building from docker/$2"
  started=$SECONDS
  context=$(mktemp -d "${TMPDIR:-/tmp}/traffic-image.XXXXXX")
  cp "$root"/docker/* "$context"/
  cp "${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$context/host-ca-certificates.crt"
  if ! docker build --force-rm --network host --build-arg "DEBIAN_IMAGE=$debian_image" -f "$context/$2" -t "$1" "$context" \
       > "$context.log" 2>&1; then
    tail -n 30 "$context.log" >&2; rm -rf "$context" "$context.log"; exit 1
  fi
  rm -rf "$context" "$context.log"
  say "$1: built in $((SECONDS - started)) s"
}
build "$python_image" python-base.Dockerfile
build "$postgres_image" postgres.Dockerfile

say "done. In .env: TRAFFIC_BASE_IMAGE=$python_image and POSTGRES_IMAGE=$postgres_image"
