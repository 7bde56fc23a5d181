#!/usr/bin/env bash
# Installs what the `vulkan` feature (ggml's Vulkan backend) needs to build
# and what its tests run on: the Vulkan loader and its headers, glslc (ggml
# compiles its compute shaders at build time), SPIRV-Headers, and Mesa's
# Vulkan drivers, whose lavapipe (a Vulkan device on the CPU) is the device
# CI runs the GPU tests on.
#
# ggml-vulkan needs Vulkan-Hpp newer than Debian 12's libvulkan-dev 1.3.239
# (it uses vk::LayerSettingEXT, added in 1.3.261). Where the installed
# headers lack it, the headers of Debian 13's libvulkan-dev are unpacked
# (never installed: the loader stays the system's) into .vulkan-sdk/include,
# which .cargo/config.toml hands to ggml's CMake as VULKAN_SDK. The package
# comes from the machine's own Debian mirror through a private apt state
# under .vulkan-sdk/apt; the system's sources are left alone.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sdk="$root/.vulkan-sdk"

missing=()
[ -f /usr/include/vulkan/vulkan.hpp ] || missing+=(libvulkan-dev)
command -v glslc >/dev/null 2>&1 || missing+=(glslc)
[ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || missing+=(spirv-headers)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Headers new enough already (a newer distribution, or ours unpacked before).
has_layer_settings() { grep -qs "struct LayerSettingEXT" "$1/vulkan/vulkan_structs.hpp"; }
if has_layer_settings /usr/include || has_layer_settings "$sdk/include"; then
  exit 0
fi

# The system's Debian source (deb822 or one-line), with the suite replaced by trixie.
mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
[ -n "$mirror" ] || mirror=$(sed -n 's/^deb  *\(\[[^]]*\] *\)\{0,1\}\([^ ]*\/debian\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n 1)
[ -n "$mirror" ] || { echo "install-vulkan: no Debian mirror in /etc/apt to fetch trixie's Vulkan headers from" >&2; exit 1; }
apt_dir="$sdk/apt"
rm -rf "$apt_dir" "$sdk/include"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
echo "deb $mirror trixie main" >"$apt_dir/sources.list"
apt_opts=(-qq -o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives")
# As root apt would hand the download to its _apt user, who cannot write here.
[ "$(id -u)" -ne 0 ] || apt_opts+=(-o "APT::Sandbox::User=root")
echo "fetching Debian 13's Vulkan headers (libvulkan-dev) into $sdk" >&2
apt-get "${apt_opts[@]}" update
(cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev/trixie)
dpkg -x "$apt_dir"/libvulkan-dev_*.deb "$apt_dir/unpacked"
mv "$apt_dir/unpacked/usr/include" "$sdk/include"
rm -rf "$apt_dir"
has_layer_settings "$sdk/include" || { echo "install-vulkan: trixie's libvulkan-dev lacks vk::LayerSettingEXT" >&2; exit 1; }
