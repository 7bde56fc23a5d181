#!/usr/bin/env bash
# A training window on a GPU machine that has PyTorch but not this runtime
# (hamburger-train pack lays this script into each folder it makes):
#   bash .device/train/pN/window.sh stage        # keep this folder's files in $HAMBURGER_PACK
#   bash .device/train/pN/window.sh run FLAGS    # stage the last folder, join the pieces, run the window
#   bash .device/train/pN/window.sh draft FLAGS  # the same, then a draft head's window instead
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
    [ "$(basename "$f")" = window.sh ] || cp "$f" "$pack/"
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
  *) echo "usage: window.sh stage | window.sh run FLAGS | window.sh draft FLAGS" >&2; exit 2 ;;
esac
