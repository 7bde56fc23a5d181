#!/usr/bin/env bash
# The quantization sweep of a trained HAMburger with hamburger-eval's columns:
# each mix quantizes the HAMburger F16 GGUF and the base-only F16 GGUF alike,
# then `hamburger-eval run` measures tokens per step, KV entries per token,
# tokens/s against libllama on the base of the same mix (same run), and the
# base's log-likelihood of the outputs, always scored by the F16 base.
#
#   scripts/eval_sweep.sh HAM-F16.gguf BASE-F16.gguf PROMPTS.jsonl OUT_DIR [MIX ...]
#
# A mix NAME+grafted=TYPE keeps the grafted matrices at TYPE (the per-role
# policy's --grafted-type). Writes OUT_DIR/sweep.md and OUT_DIR/sweep.json.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 HAM-F16.gguf BASE-F16.gguf PROMPTS.jsonl OUT_DIR [MIX ...]" >&2; exit 2; }
ham=$1 base=$2 prompts=$3 out=$4
shift 4
mixes=("$@")
[ ${#mixes[@]} -gt 0 ] || mixes=(F16 Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0 Q4_K_M+grafted=Q8_0 Q4_0+grafted=Q8_0)
bin="$(cd "$(dirname "$0")/.." && pwd)/target/release"
n=${N:-128} limit=${LIMIT:-32} conf=${CONFIDENCE:-0.8} threads=${THREADS:-2}
mkdir -p "$out"
: > "$out/rows.jsonl"
for mix in "${mixes[@]}"; do
  name=${mix%%+*}
  extra=()
  if [[ $mix == *+grafted=* ]]; then extra=(--grafted-type "${mix##*+grafted=}"); fi
  qh="$out/ham-${mix//[+=]/_}.gguf" qb="$out/base-$name.gguf"
  if [ "$name" = F16 ]; then qh=$ham qb=$base; else
    [ -f "$qh" ] || "$bin/hamburger-quantize" "$ham" "$qh" "$name" "${extra[@]}" -t "$threads" >&2
    [ -f "$qb" ] || "$bin/hamburger-quantize" "$base" "$qb" "$name" -t "$threads" >&2
  fi
  echo "sweep: $mix" >&2
  "$bin/hamburger-eval" run -m "$qh" --baseline "$qb" --scorer "$base" --prompts "$prompts" --limit "$limit" \
    -n "$n" --confidence "$conf" -t "$threads" -o json |
    python3 -c 'import json,sys; [print(json.dumps({"mix": sys.argv[1], "bytes": int(sys.argv[2]), **r})) for r in json.load(sys.stdin)]' \
      "$mix" "$(stat -c %s "$qh")" >> "$out/rows.jsonl"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/rows.jsonl")]
json.dump(rows, open(f"{out}/sweep.json", "w"), indent=1)
lines = ["| mix | MiB | confidence | tokens/step | KV entries/token | tok/s | base tok/s | speedup | LL (ours) | LL (F16 base) | LL loss | shared prefix |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for r in rows:
    lines.append(f"| {r['mix']} | {r['bytes'] / 2**20:.1f} | {r['confidence']:.2f} | {r['tokens_per_step']:.2f} | "
                 f"{r['kv_entries_per_token']:.2f} | {r['tokens_per_s']:.1f} | {r['base_tokens_per_s']:.1f} | "
                 f"{r['speedup']:.2f}x | {r['mean_ll']:.3f} | {r['base_mean_ll']:.3f} | {100 * r['ll_loss']:+.1f}% | "
                 f"{r['shared_prefix']:.1f} |")
open(f"{out}/sweep.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
