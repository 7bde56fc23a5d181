#!/usr/bin/env bash
# Installs hamburger-train's Python environment into train/.venv (PyTorch on
# the CPU and friends, from PyPI); does nothing when it is already complete.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
stamp="$venv/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$here/requirements.txt"; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
cp "$here/requirements.txt" "$stamp"
