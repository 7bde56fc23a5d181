#!/usr/bin/env bash
# Times the README's commands as a new user meets them: on a fresh Debian 12
# minbase (debootstrap into DIR) with nothing but this machine's Rust
# toolchain bound in read-only (the README assumes Rust installed): a clone
# of this repository, `bash scripts/quickstart.sh`, then the Python package
# into a venv, and with --tests `bash scripts/test.sh` (--tests-only: that
# alone, in a chroot the quickstart already ran in). Prints each command's
# wall time; the logs are DIR/root/*.log.
#
# Needs root, debootstrap and the network (Debian's mirror, PyPI,
# crates.io). Usage: sudo bash scripts/fresh-debian.sh DIR [--tests | --tests-only]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: fresh-debian.sh DIR [--tests | --tests-only]" >&2; exit 2; }
root=$(realpath -m "$1")
tests=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=$(dirname "$(command -v cargo)")

if [ ! -f "$root/etc/debian_version" ]; then
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$root.debootstrap.log"
fi
mounts=()
bind() {  # bind SOURCE TARGET [ro]
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$root$2"
  mounts=("$root$2" "${mounts[@]}")
}
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mkdir -p "$root/proc" && mount -t proc proc "$root/proc" && mounts=("$root/proc")
bind /dev /dev
bind /sys /sys
bind "$rustup_home" /opt/rustup ro
bind "$cargo_bin" /opt/cargo-bin ro
cp /etc/resolv.conf "$root/etc/resolv.conf"
# A host that reaches the registries through its own certificate authority
# (SSL_CERT_FILE) lends the chroot its bundle.
ca=()
if [ -n "${SSL_CERT_FILE:-}" ] && [ -f "$SSL_CERT_FILE" ]; then
  cp "$SSL_CERT_FILE" "$root/etc/host-ca.crt"
  ca=(SSL_CERT_FILE=/etc/host-ca.crt CARGO_HTTP_CAINFO=/etc/host-ca.crt PIP_CERT=/etc/host-ca.crt)
fi
rm -rf "$root/root/project"
git clone -q "$repo" "$root/root/project"

# Runs a command in the chroot as a fresh login would, timed.
timed() {
  local name=$1 start
  shift
  start=$(date +%s)
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/root/.cargo/bin:/opt/cargo-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo RUSTUP_AUTO_INSTALL=0 DEBIAN_FRONTEND=noninteractive "${ca[@]}" \
    bash -c "cd /root/project && $*" >"$root/root/$name.log" 2>&1 || {
    echo "$name: failed after $(($(date +%s) - start)) s (log: $root/root/$name.log)" >&2
    return 1
  }
  echo "$name: $(($(date +%s) - start)) s"
}
if [ "$tests" != --tests-only ]; then
  timed quickstart "bash scripts/quickstart.sh </dev/null"
  timed python "python3 -m venv .venv && .venv/bin/pip install ./python && .venv/bin/python -c 'import hamburger; print(hamburger.Llama)'"
fi
case "$tests" in --tests | --tests-only) timed tests "bash scripts/test.sh" ;; esac
