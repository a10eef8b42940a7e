#!/usr/bin/env bash
# Runs every test from a fresh clone: installs what is missing, fetches the reference tokenizer files,
# builds (Release), runs the suite, then builds again with AddressSanitizer + UndefinedBehaviorSanitizer
# and runs the CPU tests under it, then fuzzes every parser of untrusted input for a bounded time
# (ENTROPYINFER_FUZZ_SECONDS per target, default 30).
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
ENTROPYINFER_FUZZ_JOBS="$jobs" scripts/fuzz.sh "${ENTROPYINFER_FUZZ_SECONDS:-30}"
# The CUDA backend must at least compile where nvcc exists; its tests skip cleanly without a GPU.
nvcc_path=$(command -v nvcc || true)
[[ -z $nvcc_path && -x /usr/local/cuda/bin/nvcc ]] && nvcc_path=/usr/local/cuda/bin/nvcc
if [[ -n $nvcc_path ]]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DENTROPYINFER_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_path"
  ninja -C build-cuda -j"$jobs" entropyinfer_cuda entropyinfer_gpu_tests entropyinfer_gpu_bench
  build-cuda/entropyinfer_gpu_tests --gtest_brief=1
else
  echo "nvcc not found: the CUDA backend was not compiled"
fi
echo "all tests passed (Release, ASan/UBSan, fuzzing, CUDA compile)"
