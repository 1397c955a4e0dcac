#!/usr/bin/env bash
# Build the image scripts/profile_coding_actions.py profiles coding actions in (skipped when present).
#
#   tangram-profile  tangram-python's Debian root (python3, grep, coreutils) plus, from Debian
#                    bookworm with apt-get in that root (chroot): make, gcc, libc6-dev; and under
#                    /opt/profile (read-only in a sandbox; actions copy what they write into /work):
#     site/     pytest, pytest-xdist, hypothesis, numpy, scipy (host pip --target, local index)
#     wheels/   the wheels the `pip install` action installs (pip download, local index), and
#               pip's own wheel, which runs pip (`python3 wheels/pip-*.whl/pip`)
#     lua/      Lua 5.4's source (Debian's lua5.4 source package), for the `make -j` C build
#     suite/    Tangram's tests/core and the modules they import (git archive of HEAD), the
#               `pytest -n` suite: a real test suite of a real project, 117 tests
#
# Nothing is fetched but Debian packages (the mirror debootstrap uses) and wheels from pip's
# configured local index. Built once per machine (Docker keeps it): about 1-2 minutes.
#
# Usage: scripts/ensure-profile-image.sh [--rebuild]
# Env:   TANGRAM_DEBIAN_MIRROR (default http://deb.debian.org/debian), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=tangram-profile
BASE=tangram-python
MIRROR=${TANGRAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PY=${PYTHON:-python3}
LOG=/tmp/tangram-profile-image.log
# Same versions as the project's venv, pinned so profiles taken on different days compare.
SITE_PKGS=(pytest==9.2.0 pytest-xdist==3.8.0 hypothesis==6.170.17 numpy==2.4.6 scipy==1.17.1)
WHEEL_PKGS=(pytest==9.2.0 pytest-xdist==3.8.0 hypothesis==6.170.17 numpy==2.4.6
  attrs==26.1.0 sortedcontainers==2.4.0)
SUITE_PATHS=(tangram/__init__.py tangram/core tangram/clusters tangram/exec/__init__.py
  tangram/exec/aoe/__init__.py tangram/exec/aoe/topology.py tangram/exec/aoe/errors.py
  tests/__init__.py tests/conftest.py tests/core)

say() { printf 'ensure-profile-image: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $*"; fi
}

if [ "${1:-}" = "--rebuild" ]; then
  docker image rm -f "$IMAGE" >/dev/null 2>&1 || true
fi
docker image inspect "$IMAGE" >/dev/null 2>&1 && exit 0
scripts/ensure-docker.sh

exec 8>/tmp/tangram-profile-image.lock
flock -w 900 8 || die "another build held /tmp/tangram-profile-image.lock for 15 minutes"
docker image inspect "$IMAGE" >/dev/null 2>&1 && exit 0

say "building $IMAGE from $BASE (log: $LOG)"
start=$SECONDS
dir=$(mktemp -d /tmp/tangram-profile.XXXXXX)
cid=""
cleanup() {
  as_root umount "$dir/proc" 2>/dev/null || true
  [ -n "$cid" ] && docker rm -f "$cid" >/dev/null 2>&1
  as_root rm -rf "$dir"
}
trap cleanup EXIT
cid=$(docker create "$BASE" /bin/true)
docker export "$cid" | as_root tar -C "$dir" -x
docker rm -f "$cid" >/dev/null
cid=""
: >"$LOG"

# Debian: the build tools, and Lua's source package (download only: no dpkg-dev needed).
printf 'deb %s bookworm main\ndeb-src %s bookworm main\n' "$MIRROR" "$MIRROR" \
  | as_root tee "$dir/etc/apt/sources.list" >/dev/null
as_root cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
as_root mount -t proc proc "$dir/proc"
{
  as_root chroot "$dir" apt-get update &&
    as_root chroot "$dir" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends make gcc libc6-dev &&
    as_root chroot "$dir" sh -c 'mkdir -p /tmp/src && cd /tmp/src && apt-get source --download-only lua5.4'
} >>"$LOG" 2>&1 || die "apt-get in the image root failed; see $LOG"
as_root umount "$dir/proc"
opt="$dir/opt/profile"
as_root mkdir -p "$opt"
orig=$(ls "$dir"/tmp/src/lua5.4_*.orig.tar.gz | head -n 1)
[ -f "$orig" ] || die "no lua5.4 .orig.tar.gz downloaded; see $LOG"
as_root mkdir -p "$opt/lua"
as_root tar -C "$opt/lua" --strip-components=1 -xzf "$orig"
as_root chroot "$dir" apt-get clean >>"$LOG" 2>&1
as_root rm -rf "$dir/tmp/src" "$dir/var/lib/apt/lists/"* "$dir/etc/resolv.conf"

# Wheels from pip's configured (local) index only.
{
  "$PY" -m pip install -q --no-compile --target "$opt/site" "${SITE_PKGS[@]}" &&
    "$PY" -m pip download -q --only-binary=:all: -d "$opt/wheels" "${WHEEL_PKGS[@]}" pip
} >>"$LOG" 2>&1 || die "pip from the local index failed; see $LOG"

# The test suite: the files of HEAD that tests/core needs.
as_root mkdir -p "$opt/suite"
git archive HEAD "${SUITE_PATHS[@]}" | as_root tar -C "$opt/suite" -x
git rev-parse HEAD | as_root tee "$opt/suite/COMMIT" >/dev/null

as_root tar -C "$dir" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'WORKDIR /work' -c 'CMD ["/bin/sh"]' \
  - "$IMAGE" >/dev/null || die "docker import of $IMAGE failed"
say "built $IMAGE in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
