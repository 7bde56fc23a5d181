#!/usr/bin/env bash
# A training window on a GPU machine that has PyTorch but not this runtime
# (hamburger-train pack lays this script into each folder it makes):
#   bash .device/train/pN/window.sh stage        # keep this folder's files in $HAMBURGER_PACK
#   bash .device/train/pN/window.sh run FLAGS    # stage the last folder, join the pieces, run the window
#   bash .device/train/pN/window.sh draft FLAGS  # the same, then a draft head's window instead
#   bash .device/train/pN/window.sh smoke run|draft [FLAGS]  # that stage at toy size first (below)
# `run` runs `hamburger-train window` (`draft`: `hamburger-train
# draft-window`; train/ of the working tree, python3) with FLAGS ($PYTHON,
# default python3), its work in $HAMBURGER_WORK and what comes back in $OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pack=${HAMBURGER_PACK:-/tmp/hamburger-pack}
work=${HAMBURGER_WORK:-/tmp/hamburger-window}
out=${OUT:-$PWD/window-out}
stage() {
  mkdir -p "$pack"
  for f in "$here"/*; do
    name=$(basename "$f")
    [ "$name" = window.sh ] && continue
    [ -e "$pack/${name%.piece-*}" ] && [ "$name" != "${name%.piece-*}" ] && continue  # joined already
    cp "$f" "$pack/"
  done
}
case "${1:-}" in
  stage) stage ;;
  run | draft)
    stage_name=$([ "$1" = run ] && echo window || echo draft-window)
    shift
    stage
    # a file cut into NN pieces is joined once all NN are staged (else `window` names it)
    for first in "$pack"/*.piece-00-of-*; do
      [ -e "$first" ] || continue
      n=${first##*-of-}
      name=${first%.piece-00-of-*}
      pieces=("$name".piece-*-of-"$n")
      [ "${#pieces[@]}" -eq "$((10#$n))" ] || continue
      cat "${pieces[@]}" > "$name.joining" && mv "$name.joining" "$name" && rm "${pieces[@]}"
    done
    mkdir -p "$out"
    set -o pipefail
    PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/train${PYTHONPATH:+:$PYTHONPATH}" \
      "${PYTHON:-python3}" -m hamburger_train "$stage_name" --pack "$pack" --work "$work" --out "$out" "$@" 2>&1 |
      tee "$out/$stage_name.log"
    ;;
  smoke)
    # The window (`smoke run`) or the draft head's (`smoke draft`) at toy size on this machine, in its own
    # work and output folders (beside $HAMBURGER_WORK and $OUT, so nothing of it comes back): run first in
    # the window's call, a stage that fails here fails in the first minute, not at the end of the clock.
    # FLAGS after it override the toy ones (--device cpu where there is no GPU).
    case "${2:-}" in
      run) toy=(--batch 2 --micro-batch 2 --base-lr-scale 0) ;;
      draft) toy=(--batch 8 --answered 16) ;;
      *) echo "usage: window.sh smoke run|draft [FLAGS]" >&2; exit 2 ;;
    esac
    what=$2
    shift 2
    HAMBURGER_WORK=$work-smoke OUT=$out-smoke bash "$0" "$what" --device cuda --dtype bf16 --minutes 2 \
      --answer-share 0.25 --max-tokens 16 --answer-batch 256 --steps 3 "${toy[@]}" "$@"
    ;;
  *) echo "usage: window.sh stage | window.sh run FLAGS | window.sh draft FLAGS | window.sh smoke run|draft" >&2
     exit 2 ;;
esac
