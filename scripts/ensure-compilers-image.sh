#!/usr/bin/env bash
# Build Tangram's compilers sandbox image when it is missing (a warm run takes well under a second).
#
#   tangram-compilers  tangram-python's Debian root (accounts, python3, bash, coreutils) plus
#                      Debian bookworm's g++ (C, C++), default-jdk-headless (Java 17), golang-go,
#                      nodejs and rustc, installed with apt-get inside that root (chroot), never
#                      fetched by other means; `docker import`ed like the other images.
#
# It first runs scripts/ensure-docker.sh (engine and tangram-python). Built once per machine
# (Docker keeps it): about 3-4 minutes and ~1.1 GB on the reference 2-core machine. The service's
# /run_code and the language tests call this only when they need a compiled language.
#
# Usage: scripts/ensure-compilers-image.sh
# Env:   TANGRAM_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")"

IMAGE=tangram-compilers
BASE=tangram-python
PACKAGES=(g++ default-jdk-headless golang-go nodejs rustc)
MIRROR=${TANGRAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
LOG=/tmp/tangram-compilers-build.log

say() { printf 'ensure-compilers-image: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $*"; fi
}

docker image inspect "$IMAGE" >/dev/null 2>&1 && exit 0
./ensure-docker.sh

# One build at a time (its own lock: ensure-docker.sh, called above, takes the other one).
exec 8>/tmp/tangram-compilers-image.lock
flock -w 900 8 || die "another build held /tmp/tangram-compilers-image.lock for 15 minutes"
docker image inspect "$IMAGE" >/dev/null 2>&1 && exit 0

say "building $IMAGE from $BASE + ${PACKAGES[*]} (a few minutes; log: $LOG)"
start=$SECONDS
dir=$(mktemp -d /tmp/tangram-compilers.XXXXXX)
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
echo "deb $MIRROR bookworm main" | as_root tee "$dir/etc/apt/sources.list" >/dev/null
as_root cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
as_root mount -t proc proc "$dir/proc"
{
  as_root chroot "$dir" apt-get update &&
    as_root chroot "$dir" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends "${PACKAGES[@]}"
} >"$LOG" 2>&1 || die "apt-get install in the image root failed; see $LOG"
as_root umount "$dir/proc"
as_root chroot "$dir" apt-get clean >>"$LOG" 2>&1
as_root rm -rf "$dir/var/lib/apt/lists/"* "$dir/etc/resolv.conf"
as_root tar -C "$dir" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'WORKDIR /work' -c 'CMD ["/bin/sh"]' \
  - "$IMAGE" >/dev/null || die "docker import of $IMAGE failed"
say "built $IMAGE in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
