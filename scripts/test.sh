#!/usr/bin/env bash
# Runs every test from a fresh clone: installs what is missing, fetches the reference tokenizer files,
# builds (Release, with the CUDA backend wherever nvcc exists, so that it compiles in the same build),
# runs the suite and the server's client tests (GPU tests skip without a GPU, and the count of those
# skipped is printed), then builds
# again with AddressSanitizer + UndefinedBehaviorSanitizer and runs the CPU tests under it, then fuzzes
# every parser of untrusted input for a bounded time (ENTROPYINFER_FUZZ_SECONDS per target, default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_tokenizers.sh
jobs=$(nproc)
scripts/check_format.sh
# ctest runs $jobs tests at once, each with an OpenMP team of $jobs threads. Teams that spin while
# idle (OpenMP's default) take the cores the other tests' teams are computing on: waiting passively
# runs the Release suite in 156 s instead of 240 and the sanitized one in 447 s instead of 611
# (two cores).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

# The CUDA backend must at least compile where nvcc exists; its tests skip cleanly without a GPU.
nvcc_path=$(command -v nvcc || true)
[[ -z $nvcc_path && -x /usr/local/cuda/bin/nvcc ]] && nvcc_path=/usr/local/cuda/bin/nvcc
cuda_flags=()
[[ -n $nvcc_path ]] && cuda_flags=(-DENTROPYINFER_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc_path")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}"
ninja -C build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -LE gpu
# The server under real clients (openai npm package, curl, headless Chromium, hostile HTTP).
scripts/test_serve.sh build/entropyinfer
if [[ -n $nvcc_path ]]; then
  # Every GPU test in one process: without a GPU each one skips, and says so (ctest would start a
  # process per test, 30 s of start-up for nothing).
  build/entropyinfer_gpu_tests | tee build/gpu-tests.log
  gpu_tests=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' build/gpu-tests.log)
  gpu_skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below:.*/\1/p' build/gpu-tests.log)
  gpu_skipped=${gpu_skipped:-0}
  echo "GPU tests: ${gpu_tests:-0} compiled, $((${gpu_tests:-0} - gpu_skipped)) ran, ${gpu_skipped} skipped"
else
  echo "nvcc not found: the CUDA backend was not compiled and no GPU test ran"
fi

# -O1 with line tables only: the sanitizers' reports keep their file:line stacks, and the build takes
# far less than RelWithDebInfo's -O2 -g.
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENTROPYINFER_SANITIZE=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
ninja -C build-sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-sanitize --output-on-failure -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  scripts/test_serve.sh build-sanitize/entropyinfer
ENTROPYINFER_FUZZ_JOBS="$jobs" scripts/fuzz.sh "${ENTROPYINFER_FUZZ_SECONDS:-30}"
if [[ -n $nvcc_path ]]; then
  echo "all CPU tests passed (Release, ASan/UBSan, fuzzing); CUDA compiled, GPU tests: ${gpu_tests:-0}, of which ${gpu_skipped} skipped"
else
  echo "all CPU tests passed (Release, ASan/UBSan, fuzzing); CUDA not compiled (no nvcc)"
fi
