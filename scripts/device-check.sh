#!/usr/bin/env bash
# The device check: one prepared run for a GPU machine that measures this
# runtime against libllama in the same process and writes its tables into
# one folder of at most 8 files, each stage under its own time limit and all
# of them within one budget (--budget seconds, default 450: the whole check,
# the models' making included, fits 8 minutes), so that a short lease
# always brings back tables; a stage the budget cannot reach is logged as
# skipped.
#
#   cpu.md         the CPU at each thread count (-t, the most first): pp, tg at
#                  k=1 and k=4 (forced tokens per macro step), against a
#                  CPU-only libllama;
#   cuda.md        CUDA: verify forwards of 1-8 rows, pp, tg at k=1..4;
#   spec.md        self-verified decoding (draft-mtp), 3 drafts forced at every
#                  verify forward and under the draft gate, on CUDA and on the
#                  CPU at the most threads, against libllama's plain decoding;
#   trees.md       with --shapes smollm2: the draft head on the first ShareGPT
#                  held-out prompts, 3 drafts forced, a chain and a tree of 5
#                  (--spec-draft-tree), on CUDA and on the CPU at the most
#                  threads, against libllama's plain decoding of the same base,
#                  texts compared (hamburger-eval run);
#   gate.log       the draft gate's prices as measured (base forward by rows,
#                  micro step), per self-verified run;
#   cuda-graphs.log  ggml-cuda's lines about capturing and replaying CUDA graphs;
#   engine.json    graphs built and computed and host reads per macro step
#                  (hamburger-cli --json), on each device;
#   check.log      the machine, the commit, and each stage's time and outcome.
#
# The models are made here from the repository: --shapes 1b (default) the
# Llama-3.2-1B shapes with random weights at Q4_0, --shapes smollm2 the
# trained SmolLM2-HAMburger with its draft head (SmolLM2 from the cache, as
# the tests get it) at Q8_0; or give --model HAMBURGER.gguf --baseline BASE.gguf.
#
# Usage: scripts/device-check.sh [--out DIR] [--bin DIR] [--threads 16,8,4,2,1] [--budget S]
#          [--shapes 1b|smollm2 | --model M --baseline B] [--cpu-only] [--quick]
# --quick: tiny sizes (pp64, tg16, one repetition), to test the script.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-work/device-check}
bin=target/release
threads=16,8,4,2,1
budget=450
shapes=1b
model="" baseline="" cpu_only=0 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --bin) bin=$2; shift ;;
    --threads) threads=$2; shift ;;
    --budget) budget=$2; shift ;;
    --shapes) shapes=$2; shift ;;
    --model) model=$2; shift ;;
    --baseline) baseline=$2; shift ;;
    --cpu-only) cpu_only=1 ;;
    --quick) quick=1 ;;
    *) echo "device-check.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
case "$shapes" in 1b|smollm2) ;; *) echo "device-check.sh: --shapes takes 1b or smollm2, not $shapes" >&2; exit 2 ;; esac
if [ -n "$model$baseline" ] && { [ ! -f "$model" ] || [ ! -f "$baseline" ]; }; then
  echo "device-check.sh: --model and --baseline must both name GGUF files" >&2; exit 2
fi
for tool in hamburger-bench hamburger-cli hamburger-convert hamburger-eval hamburger-quantize hamburger-testmodel; do
  [ -x "$bin/$tool" ] || { echo "device-check.sh: $bin/$tool is missing: build first (cargo build --release --workspace)" >&2; exit 2; }
done
# Quick runs on a shared test machine: tiny sizes, roomier limits.
if [ $quick = 1 ]; then pp=64 tg=16 reps=1 slack=4 prompts=2; else pp=512 tg=64 reps=2 slack=1 prompts=16; fi
max_threads=$(tr , '\n' <<<"$threads" | sort -n | tail -n 1)
deadline=$((SECONDS + budget * slack))

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${HAMBURGER_WORK:-${TMPDIR:-/tmp}/hamburger-device-check}
mkdir -p "$work"
: > "$out/check.log"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/check.log" >&2; }

# Runs "$@" under a limit of $2 seconds (at most what is left of the budget)
# as stage $1, logging its time and outcome; a failed stage is logged and the
# check goes on.
stage() {
  local name=$1 limit=$(($2 * slack)) start=$SECONDS rc=0 left=$((deadline - SECONDS))
  shift 2
  [ $left -lt $limit ] && limit=$left
  if [ $limit -lt 5 ]; then log "$name: skipped, the check's budget is spent"; return; fi
  timeout "$limit" "$@" || rc=$?
  if [ $rc = 0 ]; then log "$name: done in $((SECONDS - start)) s"
  elif [ $rc = 124 ]; then log "$name: stopped at its limit of $limit s"
  else log "$name: failed (exit $rc) after $((SECONDS - start)) s"; fi
}

log "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
gpu=0
if [ $cpu_only = 0 ]; then
  if "$bin/hamburger-cli" --list-devices 2>/dev/null | grep -qi cuda; then
    gpu=1
    log "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi missing')"
  else
    log "no CUDA device in this build or machine: the CUDA stages are left out"
  fi
fi

# The models.
make_models() {
  local ckpt
  if [ "$shapes" = 1b ]; then
    # Converted to F16, then quantized as llama.cpp's users quantize.
    ckpt=$("$bin/hamburger-testmodel" random --shape llama-3.2-1b --out "$work/1b")
    model=$work/1b-q4_0.gguf baseline=$work/1b-base-q4_0.gguf
    for kind in "" base-; do
      [ -f "$work/1b-${kind}q4_0.gguf" ] && continue
      "$bin/hamburger-convert" "$ckpt" ${kind:+--base-only} --outtype f16 --outfile "$work/1b-${kind}f16.gguf" >/dev/null
      "$bin/hamburger-quantize" "$work/1b-${kind}f16.gguf" "$work/1b-${kind}q4_0.gguf" Q4_0 >/dev/null
      rm "$work/1b-${kind}f16.gguf"
    done
  else
    ckpt=$("$bin/hamburger-testmodel" smollm2 --grafted models/smollm2-hamburger/grafted.safetensors \
      --grafted models/smollm2-hamburger/draft-head.safetensors --out "$work/smollm2")
    model=$work/smollm2-q8_0.gguf baseline=$work/smollm2-base-q8_0.gguf
    [ -f "$model" ] || "$bin/hamburger-convert" "$ckpt" --outfile "$model" --outtype q8_0 >/dev/null
    [ -f "$baseline" ] || "$bin/hamburger-convert" "$ckpt" --base-only --outfile "$baseline" --outtype q8_0 >/dev/null
  fi
}
if [ -z "$model" ]; then
  start=$SECONDS
  make_models
  log "models ($shapes): $(basename "$model"), $(basename "$baseline") in $((SECONDS - start)) s"
fi

bench=("$bin/hamburger-bench" -m "$model" --baseline "$baseline" -r $reps -o md)

# The CPU, each thread count, against a CPU-only libllama (one table).
: >"$out/cpu.md"
for t in ${threads//,/ }; do
  stage "cpu -t $t" 120 "${bench[@]}" --device cpu -t "$t" -p $pp -n $tg --forced-steps 1,4 >"$work/cpu-$t.md"
  if [ -s "$out/cpu.md" ]; then tail -n +3 "$work/cpu-$t.md" >>"$out/cpu.md"; else cat "$work/cpu-$t.md" >>"$out/cpu.md"; fi
done

# CUDA: verify rows, prompt, tokens per step; ggml-cuda's graph lines kept.
if [ $gpu = 1 ]; then
  RUST_LOG=ggml=trace stage "cuda (verify rows 1-8, pp, tg k=1..4)" 120 \
    "${bench[@]}" --device cuda -p $pp -n $tg --forced-steps 1,2,3,4 --verify-rows 1,2,3,4,5,6,7,8 \
    >"$out/cuda.md" 2>"$work/cuda.log"
  grep -i "cuda graph\|cuda_graph\|graphs" "$work/cuda.log" | sort | uniq -c | sort -rn | head -200 >"$out/cuda-graphs.log" || true
fi

# Self-verified decoding, forced and gated, with the gate's prices.
: >"$out/spec.md"
: >"$out/gate.log"
devices=(cpu)
[ $gpu = 1 ] && devices+=(cuda)
for device in "${devices[@]}"; do
  for mode in forced gated; do
    extra=()
    [ $mode = forced ] && extra=(--spec-draft-n-min 3 --spec-draft-n-max 3)
    echo "### $device, $mode drafts" >>"$out/spec.md"
    RUST_LOG=hamburger=debug stage "self-verified $mode ($device)" 45 \
      "${bench[@]}" --device $device -t "$max_threads" -p 0 -n $tg --spec-type draft-mtp "${extra[@]}" \
      >>"$out/spec.md" 2>"$work/spec.log"
    grep "self-verified:" "$work/spec.log" | sed "s/^/$device $mode: /" >>"$out/gate.log" || true
  done
done

# Trees of drafts against the chain on general chat, texts compared (the
# trained model's draft head: its acceptance is the point).
if [ "$shapes" = smollm2 ]; then
  : >"$out/trees.md"
  for device in "${devices[@]}"; do
    for tree in 0 5; do
      echo "### $device, 3 drafts forced, --spec-draft-tree $tree" >>"$out/trees.md"
      stage "trees: tree $tree ($device)" 90 "$bin/hamburger-eval" run -m "$model" --baseline "$baseline" \
        --prompts train/sharegpt-heldout.jsonl --limit $prompts -n $((tg * 2)) --confidence 1.01 --device $device \
        -t "$max_threads" --spec-type draft-mtp --spec-draft-n-min 3 --spec-draft-n-max 3 --spec-draft-tree $tree \
        >>"$out/trees.md" 2>>"$work/trees.log"
    done
  done
fi

# What the engine did per macro step, as hamburger-cli --json counts it.
: >"$out/engine.json"
for device in "${devices[@]}"; do
  for k in 1 4; do
    # Confidence 2: one token per macro step; 0: every macro step as long as --max-steps.
    confidence=$([ $k = 1 ] && echo 2 || echo 0)
    "$bin/hamburger-cli" -m "$model" --device $device -t "$max_threads" -p "The history of the city" -n $tg \
      --temp 0 --json --confidence $confidence --max-steps $k 2>/dev/null \
      | python3 -c "import json, sys; r = json.load(sys.stdin); print(json.dumps({'device': '$device', 'k': $k, 'engine': r['engine']}))" \
      >>"$out/engine.json" || log "engine counts ($device, k=$k): failed"
  done
done
log "check done: $(ls "$out" | tr '\n' ' ')"
