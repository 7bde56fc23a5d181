#!/usr/bin/env bash
# One evaluation table per candidate model: `hamburger-eval run` on the
# three held-out sets (general chat: train/sharegpt-heldout.jsonl; Python's
# standard library: train/heldout-prompts.jsonl; programming requests:
# train/code-prompts.jsonl), greedy, 128 tokens, at each confidence: tokens
# per macro step, the loss of the base's log-likelihood of the answers, and
# tokens/s against libllama on the base in the same run.
#
#   scripts/eval_candidate.sh HAM-Q8_0.gguf BASE-Q8_0.gguf OUT_DIR [SET ...]
#
# SET is sharegpt, stdlib or code (default: all three). Writes
# OUT_DIR/SET.md and OUT_DIR/SET.json for each, skipping a set whose JSON is
# there already (so an interrupted evaluation goes on where it stopped).
# CONFIDENCE (default 0.6,0.7,0.8,0.9,0.95), N (128), LIMIT (every prompt)
# and THREADS (2) set the rest.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 HAM.gguf BASE.gguf OUT_DIR [sharegpt|stdlib|code ...]" >&2; exit 2; }
ham=$1 base=$2 out=$3
shift 3
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(sharegpt stdlib code)
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/target/release"
conf=${CONFIDENCE:-0.6,0.7,0.8,0.9,0.95} n=${N:-128} threads=${THREADS:-2}
limit=()
[ -z "${LIMIT:-}" ] || limit=(--limit "$LIMIT")
mkdir -p "$out"
for set in "${sets[@]}"; do
  case $set in
    sharegpt) prompts=$root/train/sharegpt-heldout.jsonl ;;
    stdlib) prompts=$root/train/heldout-prompts.jsonl ;;
    code) prompts=$root/train/code-prompts.jsonl ;;
    *) echo "eval_candidate.sh: unknown set '$set' (sharegpt, stdlib or code)" >&2; exit 2 ;;
  esac
  [ -s "$out/$set.json" ] && continue
  echo "eval_candidate.sh: $set ($prompts)" >&2
  "$bin/hamburger-eval" run -m "$ham" --baseline "$base" --prompts "$prompts" "${limit[@]}" -n "$n" \
    --confidence "$conf" -t "$threads" -o json > "$out/$set.json.part"
  mv "$out/$set.json.part" "$out/$set.json"
  python3 - "$out/$set.json" "$set" > "$out/$set.md" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"| set | confidence | prompts | tokens/step | LL loss | speedup |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    mode = f"{r['confidence']:.2f}" if r["confidence"] is not None else r["spec_type"]
    print(f"| {sys.argv[2]} | {mode} | {r['prompts']} | {r['tokens_per_step']:.2f} | "
          f"{100 * r['ll_loss']:+.1f}% | {r['speedup']:.2f}x |")
PY
  cat "$out/$set.md"
done
