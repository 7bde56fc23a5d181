#!/usr/bin/env bash
# The GPU tests (ignored in the CPU build) on every GPU backend this machine
# can run: Vulkan on Mesa's lavapipe (a Vulkan device on the CPU, which
# scripts/install-vulkan.sh installs; on Debian 12 Mesa 25's, unpacked into
# .vulkan-sdk/lavapipe, since Mesa 22's crashes), and CUDA where the machine
# has an NVIDIA GPU. Its own command, beside scripts/test.sh (which CI runs):
# the second, `vulkan` build and lavapipe's shaders took 15 minutes on a
# 2-core AVX2 machine (docs/gpu.md).
#
#   bash scripts/gpu-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
bash scripts/install-vulkan.sh || status=$?

# The golden cases at -ngl 0, part and all in F32 and F16 (tests/integration/gpu.rs; `$2`
# filters them), and the tools and the server on the device, built with the
# `$1` feature beside the CPU build in the same target directory.
gpu_tests() {
  local feature=$1 filter=$2 start=$SECONDS
  local cargo=(cargo test --release --no-fail-fast --features "$feature")
  "${cargo[@]}" -p hamburger --test integration -- --ignored "$filter" || status=$?
  "${cargo[@]}" -p hamburger-tools --test integration -- --ignored || status=$?
  echo "GPU tests ($feature): $((SECONDS - start)) s"
}

# ggml-vulkan lists a CPU-type device only when GGML_VK_VISIBLE_DEVICES names
# it, and lavapipe has no cooperative matrices (llama.cpp's own CI sets the
# same). Its F16 arithmetic stays on: it takes the shaders real GPUs take.
lavapipe=.vulkan-sdk/lavapipe/lvp_icd.json
if [ -f "$lavapipe" ]; then
  export VK_ICD_FILENAMES="$PWD/$lavapipe"
fi
GGML_VK_VISIBLE_DEVICES=0 GGML_VK_DISABLE_COOPMAT=1 gpu_tests vulkan golden
unset VK_ICD_FILENAMES

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  if command -v nvcc >/dev/null 2>&1; then
    gpu_tests cuda ""
  else
    echo "gpu-tests: this machine has an NVIDIA GPU but no CUDA toolkit (nvcc): its GPU tests cannot run" >&2
    status=1
  fi
fi
exit "$status"
