#!/usr/bin/env bash
# Make a Docker engine and Tangram's local images available, on a fresh machine or a warm one.
#
# What it does, each step skipped when already done (a warm run takes well under a second):
#   1. apt-get install docker.io busybox-static debootstrap (and util-linux, for nsenter and ipcrm)
#      when any of them is missing;
#   2. start dockerd in the background (root) when `docker info` fails, log to /tmp/dockerd.log,
#      and wait for it (TANGRAM_DOCKERD_TIMEOUT seconds, default 60);
#   3. build the images when `docker image inspect` fails (no registry is reachable, so both are
#      made from local files and `docker import`):
#        tangram-busybox  busybox-static rootfs, user "sandbox" (uid 1000), /work (a few MB, ~1 s)
#        tangram-python   debootstrap --variant=minbase --include=python3 bookworm (~40 s, 260 MB)
#      Docker keeps images between runs, so each is built once per machine.
#
# Usage: scripts/ensure-docker.sh [--no-python]   (--no-python skips the Debian image)
# Env:   TANGRAM_DEBIAN_MIRROR (default http://deb.debian.org/debian), TANGRAM_DOCKERD_TIMEOUT.
set -euo pipefail

BUSYBOX_IMAGE=tangram-busybox
PYTHON_IMAGE=tangram-python
SANDBOX_UID=1000
MIRROR=${TANGRAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DOCKERD_TIMEOUT=${TANGRAM_DOCKERD_TIMEOUT:-60}
DOCKERD_LOG=/tmp/dockerd.log
WANT_PYTHON=1
[ "${1:-}" = "--no-python" ] && WANT_PYTHON=0

say() { printf 'ensure-docker: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $*"; fi
}

# One build at a time when several test processes call this together.
exec 9>/tmp/tangram-ensure-docker.lock
flock -w 600 9 || die "another ensure-docker.sh held /tmp/tangram-ensure-docker.lock for 10 minutes"

# --- 1. packages -------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || missing+=(docker.io)
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || missing+=(busybox-static)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
# nsenter + ipcrm: a warm-pool reset removes the last user's SysV IPC objects with them
{ command -v nsenter && command -v ipcrm; } >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  say "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
fi

# --- 2. engine ---------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    say "starting dockerd (log: $DOCKERD_LOG)"
    # 9>&-: the daemon must not inherit (and so hold forever) this script's lock.
    dockerd_bin=$(command -v dockerd || echo /usr/sbin/dockerd)
    as_root bash -c "setsid nohup '$dockerd_bin' >>'$DOCKERD_LOG' 2>&1 < /dev/null 9>&- &" 9>&-
  else
    say "dockerd is running but not answering yet; waiting"
  fi
  deadline=$((SECONDS + DOCKERD_TIMEOUT))
  until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$DOCKERD_LOG" >&2 2>/dev/null || true
      die "dockerd did not answer 'docker info' within ${DOCKERD_TIMEOUT}s; see $DOCKERD_LOG"
    fi
    sleep 0.5
  done
  say "dockerd is up after $((SECONDS + DOCKERD_TIMEOUT - deadline))s"
fi

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Accounts every Tangram image carries: root, and the unprivileged "sandbox" user actions run as.
write_accounts() {
  local root=$1
  mkdir -p "$root/etc" "$root/work" "$root/tmp"
  grep -q '^sandbox:' "$root/etc/passwd" 2>/dev/null || {
    [ -s "$root/etc/passwd" ] || echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
    echo "sandbox:x:$SANDBOX_UID:$SANDBOX_UID:sandbox:/work:/bin/sh" >>"$root/etc/passwd"
  }
  grep -q '^sandbox:' "$root/etc/group" 2>/dev/null || {
    [ -s "$root/etc/group" ] || echo 'root:x:0:' >"$root/etc/group"
    echo "sandbox:x:$SANDBOX_UID:" >>"$root/etc/group"
  }
  chown "$SANDBOX_UID:$SANDBOX_UID" "$root/work"
  chmod 1777 "$root/tmp"
}

# --- 3a. tangram-busybox -----------------------------------------------------------------
if ! have_image "$BUSYBOX_IMAGE"; then
  say "building $BUSYBOX_IMAGE"
  dir=$(mktemp -d /tmp/tangram-busybox.XXXXXX)
  trap 'rm -rf "$dir"' EXIT
  mkdir -p "$dir/bin" "$dir/root" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/usr/bin"
  cp /bin/busybox "$dir/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ -e "$dir/bin/$applet" ] || ln -s busybox "$dir/bin/$applet"
  done
  write_accounts "$dir"
  tar -C "$dir" -c . | docker import \
    -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' -c 'WORKDIR /work' -c 'CMD ["/bin/sh"]' \
    - "$BUSYBOX_IMAGE" >/dev/null || die "docker import of $BUSYBOX_IMAGE failed"
  rm -rf "$dir"
  trap - EXIT
fi

# --- 3b. tangram-python ------------------------------------------------------------------
if [ "$WANT_PYTHON" -eq 1 ] && ! have_image "$PYTHON_IMAGE"; then
  say "building $PYTHON_IMAGE with debootstrap from $MIRROR (about 40 s)"
  dir=$(mktemp -d /tmp/tangram-python.XXXXXX)
  trap 'rm -rf "$dir"' EXIT
  as_root debootstrap --variant=minbase --include=python3 bookworm "$dir" "$MIRROR" \
    >/tmp/tangram-debootstrap.log 2>&1 \
    || die "debootstrap failed; see /tmp/tangram-debootstrap.log"
  write_accounts "$dir"
  rm -rf "$dir/var/cache/apt/archives/"*.deb "$dir/var/lib/apt/lists/"*
  tar -C "$dir" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' -c 'WORKDIR /work' -c 'CMD ["/bin/sh"]' \
    - "$PYTHON_IMAGE" >/dev/null || die "docker import of $PYTHON_IMAGE failed"
  rm -rf "$dir"
  trap - EXIT
fi

say "ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null), images: $BUSYBOX_IMAGE$([ "$WANT_PYTHON" -eq 1 ] && echo " $PYTHON_IMAGE"))"
