#!/usr/bin/env bash
# The tests, in one command (the README's, and what .ci/run runs): installs
# what they need (install-deps.sh: does nothing when all is there), runs
# every crate's tests in the release build, llama-server's own test suite
# against hamburger-server (scripts/llama-suite.sh, some 6 minutes) and the
# Python package's (scripts/python-tests.sh, under 2 minutes), and ends with
# one line totalling every test binary's results: "tests: N passed, N
# failed". Exits non-zero when any test failed. The GPU tests are their own
# command (scripts/gpu-tests.sh: a second, `vulkan` build and Mesa's
# lavapipe, 15 minutes alone on a 2-core AVX2 machine, which CI's time limit
# does not hold beside the rest).
set -euo pipefail
cd "$(dirname "$0")/.."
# After each phase a line says how long it took (CI allows 45 minutes in all).
start=$SECONDS
took() { echo "== $1 took $((SECONDS - start)) s"; start=$SECONDS; }
# What the installs and the build have to work with (they need some 12 GB).
echo "== $(df -h --output=avail . | tail -1 | tr -d ' ') free on this disk"
bash scripts/install-deps.sh
took "installing what is missing"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Every crate's tests run even after a failure; the totals print either way.
status=0
cargo test --release --workspace --no-run 2>&1 | tee "$log" || status=$?
took "building the tests"
cargo test --release --workspace --no-fail-fast 2>&1 | tee -a "$log" || status=$?
took "every crate's tests"
# llama-server's own test suite against hamburger-server (docs/server.md).
bash scripts/llama-suite.sh 2>&1 | tee -a "$log" || status=$?
took "llama-server's suite"
# The Python package (python/), built and tested with pytest.
bash scripts/python-tests.sh 2>&1 | tee -a "$log" || status=$?
took "the Python package"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
