#!/usr/bin/env bash
# Self-verified decoding against llama.cpp, in the same run (docs/performance.md,
# "Self-verified decoding"):
#   1. the trained SmolLM2-HAMburger (Q8_0) on the held-out prompts and the code
#      set, greedy: one token per step (the base), self-verified (draft-mtp),
#      and libllama on the base-only export: tokens per base forward, drafted
#      tokens accepted per verify forward, tok/s, identical text;
#   2. the 1B shapes with random grafted modules (Q4_0), where nearly every
#      draft fails: tg128 one token per step, self-verified, and libllama.
# Inputs (built beforehand, see docs/performance.md):
#   SMOL=trained-q8_0.gguf SMOL_BASE=trained-base-q8_0.gguf
#   ONEB=1b-q4_0.gguf ONEB_BASE=1b-base-q4_0.gguf
# Run under `nice -n 10` on a shared machine; compare ratios, not tok/s.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
N=${N:-128}
THREADS=${THREADS:-2}
LIMIT=${LIMIT:-20}
OUT=${OUT:-work/spec-bench}
mkdir -p "$OUT"

if [[ -n "${SMOL:-}" ]]; then
  for set in train/heldout-prompts.jsonl docs/bench/code-prompts.jsonl; do
    name=$(basename "$set" .jsonl)
    "$BIN/hamburger-eval" run -m "$SMOL" --baseline "$SMOL_BASE" --prompts "$set" --limit "$LIMIT" \
      -n "$N" -t "$THREADS" --confidence 2 --spec-type draft-mtp | tee "$OUT/smollm2-$name.md"
  done
fi

if [[ -n "${ONEB:-}" ]]; then
  "$BIN/hamburger-bench" -m "$ONEB" --baseline "$ONEB_BASE" -p 0 -n "$N" -t "$THREADS" -r "${REPS:-3}" \
    --confidence 2 --spec-type draft-mtp | tee "$OUT/1b-random.md"
fi
