#!/usr/bin/env bash
# Runs every test from a fresh clone: installs what is missing, fetches the reference tokenizer files,
# builds (Release), runs the suite, then builds again with AddressSanitizer + UndefinedBehaviorSanitizer
# and runs the CPU tests under it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_tokenizers.sh
jobs=$(nproc)
scripts/check_format.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENTROPYINFER_SANITIZE=ON
ninja -C build-sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ENTROPYINFER_SANITIZER_RUN=1 ctest --test-dir build-sanitize --output-on-failure -j"$jobs"
echo "all tests passed (Release and ASan/UBSan)"
