#!/usr/bin/env bash
# Installs the Debian packages named as arguments (none: nothing to do),
# through sudo unless root; the install scripts' one way to call apt.
set -euo pipefail
[ $# -gt 0 ] || exit 0
echo "installing: $*" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
