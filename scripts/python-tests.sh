#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): builds and installs the
# package into .venv-python (`pip install ./python`, maturin over the
# workspace's release build), then runs them against models the release
# binaries make. Ends with pytest's cargo-style "test result:" line, which
# scripts/test.sh totals. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries the tests run, built as scripts/llama-suite.sh says why.
cargo test --release --workspace --no-run --quiet
bash scripts/python-venv.sh
venv=.venv-python
# Built in the workspace's target folder with the tests' dependency features
# (python/Cargo.toml's `build-like-the-tests`), so the wheel shares their
# crates: only pyo3 and the extension compile after the tests' build.
MATURIN_PEP517_ARGS="--features build-like-the-tests" PATH="$PWD/$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps ./python
cd python/tests
HF_HUB_OFFLINE=1 exec "../../$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
