#!/usr/bin/env bash
# Downloads the header-only dependencies (and GoogleTest's sources) as .deb files into .deps/ (ignored by
# git), so that they can travel to a machine without a package registry and be unpacked there with
# `dpkg -x FILE /tmp/deps` (scripts/gpu_round.sh does this). Needs apt-get, not root.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
packages=(nlohmann-json3-dev libcli11-dev googletest)
for package in "${packages[@]}"; do
  if compgen -G "${package}_*.deb" > /dev/null; then
    echo "have ${package}"
    continue
  fi
  apt-get download "${package}"
done
ls -l
