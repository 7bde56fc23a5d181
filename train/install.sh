#!/usr/bin/env bash
# Installs hamburger-train's Python environment into train/.venv (PyTorch on
# the CPU and friends, from PyPI, every package pinned in requirements.txt);
# does nothing when it is already complete.
#
# PyPI's torch for Linux brings CUDA's libraries: some 5.5 GB installed. One
# pip call for everything holds every downloaded wheel beside what it has
# unpacked, and pip's cache keeps the wheels afterwards; a CI machine's disk
# filled that way. So each large wheel (torch, triton, CUDA's) installs in a
# call of its own, the rest in one more, none through pip's cache, and
# `pip check` then confirms the set is whole.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
stamp="$venv/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$here/requirements.txt"; then
  exit 0
fi
python3 -m venv "$venv"
pins=$(grep -v '^#' "$here/requirements.txt")
large='^(torch|triton|nvidia-|cuda-)'
install() { "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps "$@"; }
for pin in $(grep -E "$large" <<<"$pins"); do
  install "$pin"
done
# shellcheck disable=SC2046 # one argument per pin
install $(grep -vE "$large" <<<"$pins")
"$venv/bin/python" -m pip check --disable-pip-version-check
cp "$here/requirements.txt" "$stamp"
