#!/usr/bin/env bash
# Runs the fuzz targets: seeds the corpora from the fixtures (fuzz-seeds),
# then each target for SECONDS (default 600), PARALLEL at a time (default 2),
# with libFuzzer's memory limit at 4 GiB and a 20 s hang limit. Logs go to
# fuzz/logs/, crashing inputs to fuzz/artifacts/<target>/.
#   bash fuzz/run.sh [SECONDS] [TARGET...]
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf unpickle checkpoint_zip safetensors_index tokenizer chat_template)
declare -A max_len=([gguf]=131072 [unpickle]=65536 [checkpoint_zip]=65536 [safetensors_index]=16384 [tokenizer]=32768 [chat_template]=8192)
cargo +nightly run -q --release --bin fuzz-seeds
cargo +nightly fuzz build --release "${targets[@]/#/}" 2>/dev/null || cargo +nightly fuzz build --release
mkdir -p logs
run_one() {
    local t=$1 seconds=$2 len=$3
    cargo +nightly fuzz run --release "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -malloc_limit_mb=4096 -timeout=20 -max_len="$len" \
        -print_final_stats=1 >"logs/$t.log" 2>&1 && echo "$t: clean" || echo "$t: FOUND SOMETHING (logs/$t.log)"
}
export -f run_one
for t in "${targets[@]}"; do echo "$t $seconds ${max_len[$t]}"; done |
    xargs -P "${PARALLEL:-2}" -L 1 bash -c 'run_one "$@"' _
