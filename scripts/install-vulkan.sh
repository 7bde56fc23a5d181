#!/usr/bin/env bash
# Installs what the `vulkan` feature (ggml's Vulkan backend) needs to build
# and what its tests run on: the Vulkan loader and its headers, glslc (ggml
# compiles its compute shaders at build time), SPIRV-Headers, and Mesa's
# Vulkan drivers, whose lavapipe (a Vulkan device on the CPU) is the device
# CI runs the GPU tests on.
#
# Two things Debian 12 ships too old, taken from newer Debian packages
# without installing them (the system's loader and drivers stay), through a
# private apt state on the machine's own Debian mirror (the system's sources
# are left alone):
# * ggml-vulkan needs Vulkan-Hpp newer than libvulkan-dev 1.3.239 (it uses
#   vk::LayerSettingEXT, added in 1.3.261): Debian 13's headers go to
#   .vulkan-sdk/include, which .cargo/config.toml hands to ggml's CMake as
#   VULKAN_SDK.
# * Mesa 22.3's lavapipe corrupts its heap and dies (SIGSEGV in its queue
#   thread) on hamburger-server's third request with every layer offloaded;
#   Mesa 25.0's, from bookworm-backports, runs the same requests exactly:
#   its lavapipe goes to .vulkan-sdk/lavapipe, with an ICD file that gpu-tests.sh
#   hands to the Vulkan loader (VK_ICD_FILENAMES).
set -euo pipefail
trap 'echo "install-vulkan.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
root="$(cd "$(dirname "$0")/.." && pwd)"
sdk="$root/.vulkan-sdk"

missing=()
[ -f /usr/include/vulkan/vulkan.hpp ] || missing+=(libvulkan-dev)
command -v glslc >/dev/null 2>&1 || missing+=(glslc)
[ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || missing+=(spirv-headers)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
bash "$(dirname "$0")/apt-install.sh" "${missing[@]}"

# What is still to fetch: Debian 13's headers unless some are new enough,
# Mesa 25's lavapipe where the system's Mesa is older than 23.
has_layer_settings() { grep -qs "struct LayerSettingEXT" "$1/vulkan/vulkan_structs.hpp"; }
fetch=()
has_layer_settings /usr/include || has_layer_settings "$sdk/include" || fetch+=(libvulkan-dev/trixie)
mesa=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo 99)
if dpkg --compare-versions "$mesa" lt 23 && [ ! -f "$sdk/lavapipe/lvp_icd.json" ]; then
  fetch+=(mesa-vulkan-drivers/bookworm-backports)
fi
[ ${#fetch[@]} -gt 0 ] || exit 0

# The system's Debian mirror: the archive its own release's packages come
# from, as apt itself reads the sources (deb822 or one-line, any address: a
# proxy, a snapshot, a trailing slash), so no format of /etc/apt is guessed.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
mirror=$(apt-get indextargets --no-release-info --format '$(RELEASE) $(REPO_URI)' 2>/dev/null |
  awk -v release="$codename" '$1 == release && !found { print $2; found = 1 }') || mirror=""
[ -n "$mirror" ] || { echo "install-vulkan: apt lists no source for Debian '$codename' to fetch ${fetch[*]} from" >&2; exit 1; }
apt_dir="$sdk/apt"
rm -rf "$apt_dir"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
printf 'deb %s trixie main\ndeb %s bookworm-backports main\n' "$mirror" "$mirror" >"$apt_dir/sources.list"
apt_opts=(-qq -o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives")
# As root apt would hand the download to its _apt user, who cannot write here.
[ "$(id -u)" -ne 0 ] || apt_opts+=(-o "APT::Sandbox::User=root")
echo "fetching ${fetch[*]} into $sdk" >&2
apt-get "${apt_opts[@]}" update
(cd "$apt_dir" && apt-get "${apt_opts[@]}" download "${fetch[@]}")
for deb in "$apt_dir"/*.deb; do dpkg -x "$deb" "$apt_dir/unpacked"; done
if [ -d "$apt_dir/unpacked/usr/include/vulkan" ]; then
  rm -rf "$sdk/include"
  mv "$apt_dir/unpacked/usr/include" "$sdk/include"
  has_layer_settings "$sdk/include" || { echo "install-vulkan: trixie's libvulkan-dev lacks vk::LayerSettingEXT" >&2; exit 1; }
fi
lvp=$(find "$apt_dir/unpacked" -name libvulkan_lvp.so | head -n 1)
if [ -n "$lvp" ]; then
  mkdir -p "$sdk/lavapipe"
  mv "$lvp" "$sdk/lavapipe/libvulkan_lvp.so"
  api=$(sed -n 's/.*"api_version": *"\([^"]*\)".*/\1/p' "$(find "$apt_dir/unpacked" -name 'lvp_icd*.json' | head -n 1)")
  printf '{\n    "ICD": {\n        "api_version": "%s",\n        "library_path": "%s"\n    },\n    "file_format_version": "1.0.0"\n}\n' \
    "$api" "$sdk/lavapipe/libvulkan_lvp.so" >"$sdk/lavapipe/lvp_icd.json"
fi
rm -rf "$apt_dir"
