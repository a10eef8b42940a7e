#!/usr/bin/env bash
# Installs the Debian packages the build and tests need, only those missing. Safe to run repeatedly.
set -euo pipefail
# clang, its runtime libraries (libFuzzer, sanitizers) and its OpenMP build the fuzz targets;
# cpp-httplib builds `entropyinfer serve`, whose browser test drives chromium.
packages=(cmake ninja-build g++ nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev nodejs npm
  python3 clang-format clang libclang-rt-14-dev libomp-14-dev libcpp-httplib-dev chromium)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
# npm may come with Node.js from elsewhere; only ask Debian for it when there is no npm at all.
if command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/npm/}")
  missing=("${missing[@]/nodejs/}")
fi
read -r -a missing <<<"${missing[*]}"
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  runner=()
  [[ $(id -u) -ne 0 ]] && runner=(sudo)
  "${runner[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${runner[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
