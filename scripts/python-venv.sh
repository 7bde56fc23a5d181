#!/usr/bin/env bash
# The Python package's build and test environment, .venv-python (maturin,
# pytest, jsonschema), which scripts/python-tests.sh builds the package
# into; does nothing when it is already complete. (install-deps.sh runs it
# too, so that scripts/test.sh installs it with the rest before the build.)
set -euo pipefail
venv="$(dirname "$0")/../.venv-python"
"$venv/bin/python" -c "import maturin, pytest, jsonschema" >/dev/null 2>&1 || {
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q maturin pytest jsonschema
}
