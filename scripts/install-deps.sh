#!/usr/bin/env bash
# Installs everything the tests need (scripts/test.sh and .ci/run call it):
# what building needs (install-build-deps.sh: cmake, libclang, pip), then
# the tests' Python environment (.venv-tests: the openai client the server's
# compatibility test uses, jinja2, the chat-template test's reference
# renderer), the chat page's browser
# test (Debian's chromium and chromium-driver, and selenium in its own
# environment, .venv-browser), lm-eval's API models (.venv-lm-eval), the
# training tool's environment (train/.venv: PyTorch on the CPU), which its
# tests run, the Python package's (.venv-python: python-venv.sh), and
# llama-server's test suite with its environment (.venv-llama-suite).
# Building and chatting need none of these. (The GPU tests' own, the
# `vulkan` build's packages and Mesa's lavapipe, come with
# scripts/gpu-tests.sh, through install-vulkan.sh.)
set -euo pipefail
trap 'echo "install-deps.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
# Each environment installs once: pip's cache would only hold a second copy
# of every wheel on a disk that CI machines keep small.
export PIP_NO_CACHE_DIR=1

bash "$(dirname "$0")/install-build-deps.sh"
missing=()
# The training tool's `pack` lists the working tree with git (what travels
# to a GPU machine); a minimal system may lack it.
command -v git >/dev/null 2>&1 || missing+=(git)
# The chat page's test drives headless Chromium through its driver.
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
bash "$(dirname "$0")/apt-install.sh" "${missing[@]}"
# The tests' Python (.venv-tests; Debian's own Python refuses pip installs
# outside a virtual environment): the official openai client, which the
# server's compatibility test drives it with, and jinja2, with which the
# chat-template test renders llama.cpp's templates as transformers does.
tests_venv="$(dirname "$0")/../.venv-tests"
"$tests_venv/bin/python" -c "import openai, jinja2" >/dev/null 2>&1 || {
  python3 -m venv "$tests_venv"
  "$tests_venv/bin/pip" install -q openai jinja2 >/dev/null
}
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
# The Python package's build and test environment.
bash "$(dirname "$0")/python-venv.sh"
# llama-server's test suite (from llama-cpp-python's source distribution) and its environment.
python3 "$(dirname "$0")/llama_server_suite.py" prepare
