#!/usr/bin/env bash
# Installs the Debian packages named as arguments (none: nothing to do),
# through sudo unless root; the install scripts' one way to call apt.
#
# When another apt or dpkg holds its lock (a laptop's unattended upgrades,
# two installs at once), it waits for it, up to APT_LOCK_TIMEOUT seconds
# (default 600), then fails with one line naming the process that holds it.
set -euo pipefail
[ $# -gt 0 ] || exit 0
timeout="${APT_LOCK_TIMEOUT:-600}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

# The locks apt-get update and install take, in the order they take them.
locks=(/var/lib/apt/lists/lock /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/cache/apt/archives/lock)

# The process holding one of the locks, as "PID (NAME) on FILE", or nothing:
# read from /proc/locks (device and inode of each lock file), so that
# neither root nor fuser/lsof is needed.
holder() {
  local file id pid
  for file in "${locks[@]}"; do
    [ -e "$file" ] || continue
    # /proc/locks names a lock's file as MAJOR:MINOR:INODE, the device in hex.
    id=$(printf '%02x:%02x:%s' "$(stat -c %Hd "$file")" "$(stat -c %Ld "$file")" "$(stat -c %i "$file")")
    # (Lines with "->" are processes waiting for a lock, not holding it.)
    pid=$(awk -v id="$id" '!/->/ { for (i = 2; i <= NF; i++) if ($i == id) { print $(i - 1); exit } }' /proc/locks)
    if [ -n "$pid" ]; then
      echo "$pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo '?')) on $file"
      return 0
    fi
  done
}

# Waits until no process holds the locks, printing one line when it starts
# waiting; fails with one line when $timeout seconds pass first.
wait_for_lock() {
  local start=$SECONDS held
  held=$(holder)
  [ -n "$held" ] || return 0
  echo "apt-install.sh: waiting up to ${timeout}s for apt's lock, held by process $held" >&2
  while [ -n "$held" ]; do
    if [ $((SECONDS - start)) -ge "$timeout" ]; then
      echo "apt-install.sh: apt's lock is still held after ${timeout}s by process $held; try again when it has finished" >&2
      exit 1
    fi
    sleep 2
    held=$(holder)
  done
}

echo "installing: $*" >&2
# apt-get waits for dpkg's lock itself (DPkg::Lock::Timeout) but not for the
# package lists' (apt-get update fails at once), so each call waits first,
# and is tried once more if another process took a lock in between.
apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$timeout")
[ -z "$sudo" ] || apt=("$sudo" "${apt[@]}")
apt_get() {
  wait_for_lock
  if ! "${apt[@]}" "$@"; then
    [ -n "$(holder)" ] || exit 1
    wait_for_lock
    "${apt[@]}" "$@"
  fi
}
apt_get update -qq
apt_get install -y -qq "$@" >/dev/null
