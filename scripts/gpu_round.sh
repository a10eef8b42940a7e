#!/usr/bin/env bash
# One whole round on the GPU machine (one H200, no package registry): unpack the carried header-only
# dependencies (.deps/*.deb, from scripts/fetch_header_deps.sh), build GoogleTest from its sources and the
# CUDA build with all cores, run the GPU tests, run the benchmarks next to their torch references, and
# write one log, JSON and markdown into $OUT (few files: the device run returns at most 8). Prints a short
# table last.
#   OUT            output folder (the device run sets it)
#   GPU_ROUND      what to run: comma-separated subset of
#                  build,quality,tests,generate,checkpoint,attention,sparse,model,methods,bench,gemm,
#                  fp8,fp8quality,protocols,tuning,profile,needle,inspect,capacity,serve (default: all
#                  but quality, checkpoint, gemm, fp8, fp8quality, protocols, tuning, profile, needle,
#                  inspect, capacity and serve)
#   protocols      a model's eval under the quality lab's protocols (PROTOCOL_MODEL, default the shipped
#                  model; PROTOCOLS, PROTOCOL_TASKS, PROTOCOL_LENGTHS, PROTOCOL_BUDGETS, PROTOCOL_METHODS),
#                  one eval per protocol, each sized to its entry of PROTOCOL_SECONDS (one number, or
#                  one per protocol), at most PROTOCOL_SAMPLES per cell, or PROTOCOL_COUNTS samples
#                  exactly (one number or one per protocol, no probe); PROTOCOL_FIRST_SAMPLES (one per
#                  protocol, default 0) runs a shard that `entropyinfer eval-report` merges with the
#                  others; carry .cache/assets-text
#   smpartition    bench/gpu/sm_partition_probe.cu: a memory stream on SM_PARTITION_COUNTS
#                  multiprocessors (default "16 24 32 48") beside bf16 GEMMs on the rest, green
#                  contexts, against both on the whole GPU one after the other
#   trace          the kernels of a decode step at TRACE_CONTEXTS (default 32768) as they run in
#                  the step's graph (CUPTI; `entropyinfer_gpu_bench model --kernel-trace`), once per
#                  entry of TRACE_VARIANTS (default "bf16 fp8"; fp8: FP8 weights and FP8 cache),
#                  written to trace-VARIANT.json in $OUT
#   matchprobe     training/smoke/match_probe.py on the GPU (torch): MATCH_PROBE_SWEEP (default the
#                  three formats), each for MATCH_PROBE_SECONDS (default 150), MATCH_PROBE_ARGS shared
#                  by all (default the training model's shape, 512 x 160 ids, 2-6 needles all asked)
#   fp8scales      bench/gpu/fp8_scale_modes_probe.cu: cuBLASLt's FP8 matmul at FP8_SCALE_ROWS rows
#                  (default "16 32 64") with per-row scales, swapped, and unscaled + a scaling kernel
#   GEMM_ARGS      more flags for the gemm step (e.g. "--tokens 16,32,64")
#   fp8quality     the shipped model's eval (FP8_EVAL_TASKS, FP8_EVAL_LENGTHS, FP8_EVAL_SAMPLES,
#                  FP8_EVAL_METHODS, FP8_EVAL_BUDGETS) per entry of FP8_EVAL_VARIANTS (default all
#                  four: bf16, fp8-weights, fp8-cache, and fp8-attention: the FP8 cache with
#                  --prompt-attention fp8, which sparse plans take only when asked; carry
#                  .cache/assets-text)
#   fp8            FP8 against bf16 (after gemm, whose JSON it reads when it ran): the model bench
#                  with bf16, FP8 projections, and FP8 projections with the FP8 KV cache
#                  (FP8_PREFILL, MODEL_DECODE), FP8_METHODS (default full,entropy+latent) at
#                  FP8_METHOD_LENGTHS (default 130816) + NEW_TOKENS in the same three, transformers'
#                  bf16 end to end; merged by bench/gpu/fp8_report.py into fp8.md and fp8.json
#   checkpoint     a 16 GB Llama-3.1-8B-shaped bf16 folder saved by transformers: cold load to ready
#                  against from_pretrained (CHECKPOINT_LOADS runs each), generate on a
#                  CHECKPOINT_PROMPT-token prompt (default 130816) per method of METHODS next to bench,
#                  seeded sampling twice (carry .cache/tokenizers/llama3)
#   needle         scripts/demo.sh's command on the GPU (16k and 32k; NEEDLE_METHODS; the haystack
#                  from TEXT_DIR, carry .cache/assets-text)
#   profile        Nsight Compute over one decode step (PROFILE_STEP, default 30, of a 4096-token
#                  prompt) per method of PROFILE_METHODS (default entropy+latent,full): GPU time
#                  per kernel, summed by kernel (bench/gpu/kernel_profile.py); PROFILE_PREFILL=N
#                  profiles one N-token prefill per method instead (all kernels but the products);
#                  PROFILE_PROMPT the prompt's length, PROFILE_ARGS more bench flags (--weights fp8)
#   TUNING_MODES   tuning: --gemm-tuning modes compared in-model, in this order (default
#                  heuristic,burst,sustained); TUNING_METHODS (default entropy+latent,full),
#                  TUNING_LENGTH (default 130816), TUNING_REPS (default 2)
#   CAPACITY_METHODS (default full,entropy+snapkv), CAPACITY_PREFILL_SECONDS (default 300),
#                  CAPACITY_TIMEOUT (default 560)
#   BUILD_TARGETS  what build builds (default entropyinfer_gpu_tests entropyinfer_gpu_bench entropyinfer)
#   TESTS_FILTER   GoogleTest filter of the GPU tests other than the Hopper kernel's (default *)
#   EVAL_SECONDS   quality: time for the eval of the shipped model (default 300); EVAL_SAMPLES at most
#                  (default 20) samples per cell; EVAL_LENGTHS, EVAL_BUDGETS; TEXT_DIR (carry .cache/assets-text)
#   BENCH_LENGTHS  attention lengths (default 8192,32768,131072)
#   MODEL_PREFILL  whole-model prompt lengths (default 16384,32768,65536,131072)
#   MODEL_DECODE   whole-model decode contexts (default 32768,131072)
#   METHOD_LENGTHS prompt lengths of the attention-method comparison (default 32768,65536,130816:
#                  with NEW_TOKENS=256 the longest fills Llama 3.1's 131072 positions)
#   SPARSE_LENGTHS lengths of the block-sparse kernel benchmark (default 32768,65536,131072)
#   SPARSE_KERNELS its kernels, space-separated (default "auto fp8")
#   METHODS        methods compared (default full,entropy+latent,critiprefill+snapkv)
#   NEW_TOKENS     tokens generated after each prompt there (default 256)
#   METHOD_STAGE_TIMES 1 adds one prefill per row timed part by part (--stage-times)
#   METHOD_ARGS    more flags for that bench (e.g. --chunk 32768); METHOD_REPS repetitions per row
#                  (default 1; the tables give medians, the JSON every run)
#   METHODS_HF     0 skips the transformers reference of the method comparison (default 1)
#   BENCH_LENGTHS_CLI  prompt lengths of `entropyinfer bench --device cuda` for dense attention
#                  (default 16384,32768,65536,131072)
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:?set OUT to the folder that receives logs and results}"
steps=",${GPU_ROUND:-build,tests,attention,sparse,model,methods,bench},"
method_lengths="${METHOD_LENGTHS:-32768,65536,130816}"
methods="${METHODS:-full,entropy+latent,critiprefill+snapkv}"
new_tokens="${NEW_TOKENS:-256}"
cli_lengths="${BENCH_LENGTHS_CLI:-16384,32768,65536,131072}"
lengths="${BENCH_LENGTHS:-8192,32768,131072}"
model_prefill="${MODEL_PREFILL:-16384,32768,65536,131072}"
model_decode="${MODEL_DECODE:-32768,131072}"
deps=/tmp/deps
build="${repo_root}/build-gpu"
jobs=$(nproc)
mkdir -p "${out}"
log="${out}/round.log"
: > "${log}"
export PYTHONUNBUFFERED=1
status=0
summary=()
step_failed() { summary+=("FAILED: $1"); status=1; }
section() { printf '\n==== %s\n' "$1" >> "${log}"; }
# size_eval LABEL SECONDS MOST ARGS...: probes `entropyinfer ARGS` with 2 samples per cell and sets
# `samples` to what fits SECONDS (at least 2, at most MOST).
size_eval() {
  local label=$1 seconds=$2 most=$3 probe_start probe_seconds
  shift 3
  probe_start=$(date +%s%N)
  timeout -k 10 240 "${build}/entropyinfer" "$@" --samples 2 --json "/tmp/${label}-probe.json" \
    >> "${log}" 2>&1 || step_failed "${label} probe"
  probe_seconds=$(( ($(date +%s%N) - probe_start) / 1000000000 + 1 ))
  # The probe's runs time their own samples: what a sample costs without the model's load and
  # warm-up, which a 2-sample probe's wall time is mostly made of. 10% is left for preparing them.
  samples=$(python3 - "/tmp/${label}-probe.json" "${probe_seconds}" "${seconds}" "${most}" <<'PY'
import json, sys
path, wall, seconds, most = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
try:
    per_sample = sum(run["seconds"] for run in json.load(open(path))["runs"]) / 2
except (OSError, ValueError, KeyError):
    per_sample = wall / 2
print(max(2, min(most, int(0.9 * seconds / max(per_sample, 1e-3)))))
PY
)
  echo "${label} probe: ${probe_seconds} s for 2 samples per cell; running ${samples} per cell" | tee -a "${log}"
}
# seeded_repeat LABEL GENERATE_ARGS...: seeded sampling on cuda (-t 0.8 --top-p 0.9 -s 7) twice, which
# must give the same text.
seeded_repeat() {
  local label=$1 run
  shift
  for run in 1 2; do
    "${build}/entropyinfer" generate "$@" --device cuda -q -t 0.8 --top-p 0.9 -s 7 \
      > "/tmp/${label}-seeded-${run}.txt" 2>> "${log}" || step_failed "seeded generate (${label})"
  done
  if cmp -s "/tmp/${label}-seeded-1.txt" "/tmp/${label}-seeded-2.txt"; then
    echo "${label} seeded sampling on cuda: identical run to run" | tee -a "${log}"
  else
    echo "${label} seeded sampling on cuda: DIFFERS run to run" | tee -a "${log}"
    step_failed "seeded repeat (${label})"
  fi
}
# SM clock, power and throttle reasons every 200 ms while a step runs (the H200 holds its 700 W cap
# by lowering the clock under long runs of matrix products), summarised into the log afterwards.
power_log_pid=""
start_power_log() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 200 > "${out}/$1-power.csv" 2>/dev/null &
  power_log_pid=$!
}
stop_power_log() {
  [[ -n "${power_log_pid}" ]] && kill "${power_log_pid}" 2>/dev/null
  power_log_pid=""
  python3 - "${out}/$1-power.csv" <<'PY' | tee -a "${log}"
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    try:
        rows.append((float(parts[1]), float(parts[2]), int(parts[3], 16)))
    except (IndexError, ValueError):
        pass
busy = [r for r in rows if r[1] > 200]  # samples with work on the GPU
if busy:
    capped = sum(1 for r in busy if r[2] & 0x4) / len(busy)
    print(f"power while busy ({len(busy)} samples of 200 ms): median {statistics.median(r[1] for r in busy):.0f} W, "
          f"SM clock median {statistics.median(r[0] for r in busy):.0f} MHz (min {min(r[0] for r in busy):.0f}), "
          f"power cap holding the clock down in {100 * capped:.0f}% of them")
PY
}

section machine
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  cmake --version | head -1
  g++ --version | head -1
} 2>&1 | tee -a "${log}"

if [[ "${steps}" == *",build,"* ]]; then
  mkdir -p "${deps}"
  for package in "${repo_root}"/.deps/*.deb; do dpkg -x "${package}" "${deps}"; done
  if [[ ! -f "${deps}/usr/lib/cmake/GTest/GTestConfig.cmake" ]]; then
    section googletest
    { cmake -S "${deps}/usr/src/googletest" -B /tmp/googletest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="${deps}/usr" -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_GMOCK=OFF \
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
      ninja -C /tmp/googletest-build -j"${jobs}" install; } >> "${log}" 2>&1 || step_failed "GoogleTest build"
  fi
  section build
  start=$(date +%s)
  { cmake -S "${repo_root}" -B "${build}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENTROPYINFER_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="${deps}/usr" &&
    ninja -C "${build}" -j"${jobs}" ${BUILD_TARGETS:-entropyinfer_gpu_tests entropyinfer_gpu_bench entropyinfer}; } >> "${log}" 2>&1 ||
    { step_failed "build"; grep -E "error|Error" "${log}" | head -30; }
  summary+=("build: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",quality,"* && -x "${build}/entropyinfer" ]]; then
  # The shipped model: transformers' reference logits (tests/fixtures/shipped_model, also copied to
  # $OUT to be committed), the CUDA engine against them up to 32k tokens, then `entropyinfer eval`
  # of every method. The eval is sized to EVAL_SECONDS from a 2-sample probe of the same grid.
  section quality
  start=$(date +%s)
  model_dir="${repo_root}/models/needle-llama-11m"
  text_dir="${TEXT_DIR:-${repo_root}/.cache/assets-text}"
  python3 "${repo_root}/scripts/shipped_model_parity.py" --model "${model_dir}" --text-dir "${text_dir}" \
    --out "${repo_root}/tests/fixtures/shipped_model/expected.json" 2>&1 | tee -a "${log}" ||
    step_failed "transformers reference of the shipped model"
  cp "${repo_root}/tests/fixtures/shipped_model/expected.json" "${out}/shipped_model_expected.json" 2>/dev/null
  if [[ -x "${build}/entropyinfer_gpu_tests" ]]; then
    timeout -k 10 120 "${build}/entropyinfer_gpu_tests" --gtest_filter='CudaShippedModel*' 2>&1 | tee -a "${log}" |
      grep -E "^\[ +(OK|FAILED|PASSED) |tokens|Failure|Expected|Which is" || step_failed "CUDA shipped-model test"
  fi
  eval_args=(eval -m "${model_dir}" --device cuda --text-dir "${text_dir}" --lengths "${EVAL_LENGTHS:-4096,8192,16384,32768}"
             --budgets "${EVAL_BUDGETS:-512,1024,2048}")
  size_eval eval "${EVAL_SECONDS:-300}" "${EVAL_SAMPLES:-20}" "${eval_args[@]}"
  mkdir -p "${out}/eval-plots"
  timeout -k 10 $(( ${EVAL_SECONDS:-300} * 2 )) "${build}/entropyinfer" "${eval_args[@]}" --samples "${samples}" \
    --json "${out}/eval.json" --markdown "${out}/eval.md" --plots "${out}/eval-plots" 2>> "${log}" |
    tee -a "${log}" | tail -5 || step_failed "eval"
  summary+=("quality: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",protocols,"* && -x "${build}/entropyinfer" ]]; then
  # The quality lab's protocols: every method at the budgets and lengths the quality-lab issue
  # names, one eval per protocol (each sized to PROTOCOL_SECONDS from a 2-sample probe of its own
  # grid, at most PROTOCOL_SAMPLES per cell): protocols-P.json.gz, protocols-P.md and
  # protocols-P-plots.tar for each protocol P.
  section protocols
  model_dir="${PROTOCOL_MODEL:-${repo_root}/models/needle-llama-11m}"
  text_dir="${TEXT_DIR:-${repo_root}/.cache/assets-text}"
  IFS=, read -r -a protocol_list <<< "${PROTOCOLS:-context-first,multi-turn}"
  IFS=, read -r -a protocol_seconds_list <<< "${PROTOCOL_SECONDS:-240}"
  IFS=, read -r -a protocol_count_list <<< "${PROTOCOL_COUNTS:-}"
  IFS=, read -r -a protocol_first_list <<< "${PROTOCOL_FIRST_SAMPLES:-0}"
  for index in "${!protocol_list[@]}"; do
    protocol=${protocol_list[index]}
    protocol_seconds=${protocol_seconds_list[index]:-${protocol_seconds_list[-1]}}
    first_sample=${protocol_first_list[index]:-${protocol_first_list[-1]}}
    start=$(date +%s)
    protocol_args=(eval -m "${model_dir}" --device cuda --text-dir "${text_dir}"
                   --tasks "${PROTOCOL_TASKS:-niah_single,niah_multikey}" --lengths "${PROTOCOL_LENGTHS:-16384,32704}"
                   --budgets "${PROTOCOL_BUDGETS:-512,2048}" --protocols "${protocol}"
                   --methods "${PROTOCOL_METHODS:-full,entropy+latent,entropy-segment+latent,critiprefill+full,full+snapkv,full+adakv,full+pyramidkv,full+streaming}"
                   --first-sample "${first_sample}")
    if (( ${#protocol_count_list[@]} )); then
      samples=${protocol_count_list[index]:-${protocol_count_list[-1]}}
    else
      size_eval "protocols-${protocol}" "${protocol_seconds}" "${PROTOCOL_SAMPLES:-200}" "${protocol_args[@]}"
    fi
    mkdir -p "${out}/protocols-${protocol}-plots"
    timeout -k 10 $(( protocol_seconds * 2 )) "${build}/entropyinfer" "${protocol_args[@]}" --samples "${samples}" \
      --json "${out}/protocols-${protocol}.json" --markdown "${out}/protocols-${protocol}.md" \
      --plots "${out}/protocols-${protocol}-plots" 2>> "${log}" | tee -a "${log}" | tail -5 ||
      step_failed "protocols eval (${protocol})"
    gzip -f "${out}/protocols-${protocol}.json"
    (cd "${out}" && tar cf "protocols-${protocol}-plots.tar" "protocols-${protocol}-plots" && rm -rf "protocols-${protocol}-plots")
    summary+=("protocols ${protocol}: ${samples} samples per cell, $(( $(date +%s) - start )) s")
  done
fi

if [[ "${steps}" == *",fp8quality,"* && -x "${build}/entropyinfer" ]]; then
  # The shipped model's eval in bf16, with FP8 projections (quantized at load), with the FP8 KV
  # cache, and with the FP8 cache and FP8 prompt attention for every plan, each on the same samples:
  # fp8-eval-<variant>.{json,md}, tarred into fp8-eval.tar.
  section fp8quality
  start=$(date +%s)
  model_dir="${repo_root}/models/needle-llama-11m"
  text_dir="${TEXT_DIR:-${repo_root}/.cache/assets-text}"
  for variant in ${FP8_EVAL_VARIANTS:-bf16 fp8-weights fp8-cache fp8-attention}; do
    variant_args=()
    [[ "${variant}" == fp8-weights ]] && variant_args=(--weights fp8)
    [[ "${variant}" == fp8-cache ]] && variant_args=(--kv-cache fp8)
    [[ "${variant}" == fp8-attention ]] && variant_args=(--kv-cache fp8 --prompt-attention fp8)
    timeout -k 10 240 "${build}/entropyinfer" eval -m "${model_dir}" --device cuda --text-dir "${text_dir}" \
      --tasks "${FP8_EVAL_TASKS:-niah_single,niah_multikey}" --lengths "${FP8_EVAL_LENGTHS:-4096,16384}" \
      --samples "${FP8_EVAL_SAMPLES:-100}" --methods "${FP8_EVAL_METHODS:-full,entropy+latent}" \
      --budgets "${FP8_EVAL_BUDGETS:-512}" "${variant_args[@]}" --json "${out}/fp8-eval-${variant}.json" \
      --markdown "${out}/fp8-eval-${variant}.md" 2>> "${log}" | tee -a "${log}" | tail -3 ||
      step_failed "eval (${variant})"
  done
  (cd "${out}" && tar cf fp8-eval.tar fp8-eval-*.json fp8-eval-*.md && rm -f fp8-eval-*.json fp8-eval-*.md)
  summary+=("fp8quality: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",tests,"* && -x "${build}/entropyinfer_gpu_tests" ]]; then
  section tests
  start=$(date +%s)
  # A kernel that deadlocks must not eat the whole device call; the Hopper kernel's tests run last and
  # alone, so that everything else is measured even if it hangs.
  timeout -k 10 "${TESTS_TIMEOUT:-300}" "${build}/entropyinfer_gpu_tests" --gtest_filter="${TESTS_FILTER:-*}-*Wgmma*" \
    --gtest_output="json:${out}/gpu-tests.json" >> "${log}" 2>&1 || step_failed "GPU tests"
  timeout -k 10 120 "${build}/entropyinfer_gpu_tests" --gtest_filter='*WgmmaSimple*' >> "${log}" 2>&1 ||
    step_failed "GPU tests (wgmma without overlap)"
  timeout -k 10 180 "${build}/entropyinfer_gpu_tests" --gtest_filter='*WgmmaPrefill*:*WgmmaAndMma*' \
    >> "${log}" 2>&1 || step_failed "GPU tests (wgmma)"
  summary+=("GPU tests: $(( $(date +%s) - start )) s")
  sed -n '/==== tests/,$p' "${log}" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|Expected|Which is|actual|error" | head -60
  # The measured logit errors and greedy agreement per parity fixture (tests/gpu/test_cuda_parity_fixtures.cpp).
  grep -E "^\[ (parity|greedy) +\]" "${log}"
fi

if [[ "${steps}" == *",generate,"* && -x "${build}/entropyinfer" ]]; then
  # `entropyinfer generate` on both devices through the one engine interface, on the shipped model
  # with a 2k-token prompt and small budgets (so every method is sparse): greedy text per method on
  # cpu and cuda, and seeded sampling twice on cuda.
  section generate
  start=$(date +%s)
  model_dir="${repo_root}/models/needle-llama-11m"
  prompt_file=/tmp/generate-prompt.txt
  python3 -c "
import sys
lines = [f'Entry {i} in the harbour log: the {\"north\" if i % 2 else \"south\"} pier took {5 * i + 2} barrels of salt.' for i in range(120)]
sys.stdout.write(' '.join(lines) + ' The south pier took on entry 64 a number of barrels equal to')" > "${prompt_file}"
  budgets=(--segment-size 128 --block-size 16 --sparse-threshold 512 --base-budget 256 --critiprefill-budget 256
           --decode-budget 256 --window 32 --decode-gap 16)
  for method in full entropy+latent critiprefill+snapkv; do
    prefill=${method%%+*}; decode=full; [[ ${method} == *+* ]] && decode=${method#*+}
    for device in cpu cuda; do
      "${build}/entropyinfer" generate -m "${model_dir}" -f "${prompt_file}" -n 48 --device "${device}" \
        --prefill "${prefill}" --decode "${decode}" "${budgets[@]}" > "/tmp/generate-${method}-${device}.txt" \
        2> "/tmp/generate-${method}-${device}.err" || step_failed "generate ${method} on ${device}"
      tail -2 "/tmp/generate-${method}-${device}.err" | tee -a "${log}"
    done
    if cmp -s "/tmp/generate-${method}-cpu.txt" "/tmp/generate-${method}-cuda.txt"; then
      echo "generate ${method}: greedy text identical on cpu and cuda" | tee -a "${log}"
    else
      echo "generate ${method}: greedy text differs between cpu and cuda:" | tee -a "${log}"
      diff <(tail -c 400 "/tmp/generate-${method}-cpu.txt") <(tail -c 400 "/tmp/generate-${method}-cuda.txt") | tee -a "${log}"
    fi
  done
  seeded_repeat "generate" -m "${model_dir}" -f "${prompt_file}" -n 48 --prefill entropy --decode latent \
    "${budgets[@]}"
  summary+=("generate: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",checkpoint,"* && -x "${build}/entropyinfer" ]]; then
  # A user's checkpoint as transformers saves it (Llama-3.1-8B shape, random bf16 weights, 4 shards,
  # 16 GB, carry .cache/tokenizers/llama3): cold-cache load to ready against transformers'
  # from_pretrained(device_map="cuda") (CHECKPOINT_LOADS alternating runs each, page cache dropped
  # before every one), then `generate --device cuda` on a CHECKPOINT_PROMPT-token prompt file per
  # method of METHODS next to `bench` on the same folder and shapes, and seeded sampling twice.
  section checkpoint
  start=$(date +%s)
  checkpoint=/tmp/llama-3.1-8b-bf16
  prompt_tokens="${CHECKPOINT_PROMPT:-130816}"
  prompt_file=/tmp/checkpoint-prompt.txt
  python3 "${repo_root}/bench/gpu/make_hf_checkpoint.py" --out "${checkpoint}" \
    --tokenizer "${repo_root}/.cache/tokenizers/llama3/tokenizer.json" --prompt-file "${prompt_file}" \
    --prompt-tokens "${prompt_tokens}" 2>> "${log}" | tee -a "${log}" "${out}/checkpoint-make.json" ||
    step_failed "making the checkpoint"
  drop_page_cache() { sync; echo 3 > /proc/sys/vm/drop_caches; }
  : > "${out}/checkpoint-loads.txt"
  # The floor under any cold load: the shards read from disk into nothing, all four at once.
  drop_page_cache
  read_start=$(date +%s%N)
  readers=()
  for shard in "${checkpoint}"/*.safetensors; do cat "${shard}" > /dev/null & readers+=($!); done
  wait "${readers[@]}"
  read_ms=$(( ($(date +%s%N) - read_start) / 1000000 ))
  echo "disk: the shards read cold in parallel by cat in ${read_ms} ms" | tee -a "${log}" "${out}/checkpoint-loads.txt"
  for run in $(seq "${CHECKPOINT_LOADS:-2}"); do
    drop_page_cache
    python3 "${repo_root}/bench/gpu/hf_load_time.py" "${checkpoint}" 2>> "${log}" |
      tee -a "${log}" "${out}/checkpoint-loads.txt" || step_failed "transformers load"
    drop_page_cache
    "${build}/entropyinfer" generate -m "${checkpoint}" -p "Hello" -n 1 --device cuda --ignore-eos \
      > /dev/null 2> /tmp/checkpoint-load.err || step_failed "engine load"
    grep "model ready" /tmp/checkpoint-load.err | sed "s/^/engine (cold) /" | tee -a "${log}" "${out}/checkpoint-loads.txt"
  done
  IFS=, read -r -a checkpoint_methods <<< "${methods}"
  for method in "${checkpoint_methods[@]}"; do
    prefill=${method%%+*}; decode=full; [[ ${method} == *+* ]] && decode=${method#*+}
    timeout -k 10 300 "${build}/entropyinfer" generate -m "${checkpoint}" -f "${prompt_file}" -n "${new_tokens}" \
      --ignore-eos --device cuda --prefill "${prefill}" --decode "${decode}" > "/tmp/checkpoint-${method}.txt" \
      2> "/tmp/checkpoint-${method}.err" || step_failed "generate ${method} on the checkpoint"
    grep -E "model ready|prompt tokens" "/tmp/checkpoint-${method}.err" | sed "s/^/generate ${method}: /" |
      tee -a "${log}" "${out}/checkpoint-generate.txt"
  done
  bench_prompt=$(sed -n 's/.*prompt tokens: \([0-9]*\).*/\1/p' "/tmp/checkpoint-${checkpoint_methods[0]}.err" | head -1)
  timeout -k 10 400 "${build}/entropyinfer" bench -m "${checkpoint}" --device cuda -p "${bench_prompt:-${prompt_tokens}}" \
    -n "${new_tokens}" -r 1 --methods "${methods}" --markdown "${out}/checkpoint-bench.md" \
    --json "${out}/checkpoint-bench.json" 2>> "${log}" | tee -a "${log}" || step_failed "bench on the checkpoint"
  seeded_repeat "checkpoint" -m "${checkpoint}" -p "The harbour log of the north pier" -n 32
  summary+=("checkpoint: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",attention,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  section attention
  # A kernel variant that failed or hung in the tests is not measured.
  tests_log=$(sed -n '/==== tests/,$p' "${log}")
  last_test=$(grep -E '^\[ RUN|^\[       OK|^\[  FAILED' <<< "${tests_log}" | tail -1)
  kernels=mma
  if ! grep -q "FAILED.*WgmmaSimple" <<< "${tests_log}" && [[ "${last_test}" != *RUN*WgmmaSimple* ]]; then
    kernels="wgmma_simple,${kernels}"
  fi
  if ! grep -qE "FAILED.*(WgmmaPrefill|WgmmaAndMma)" <<< "${tests_log}" &&
     [[ "${last_test}" != *RUN*WgmmaPrefill* && "${last_test}" != *RUN*WgmmaAndMma* ]]; then
    kernels="wgmma,${kernels}"
  fi
  if ! grep -q "FAILED.*CudaFp8Attention" <<< "${tests_log}" && [[ "${last_test}" != *RUN*CudaFp8Attention* ]]; then
    kernels="${kernels},fp8"
  fi
  timeout -k 10 300 "${build}/entropyinfer_gpu_bench" attention --lengths "${lengths}" --kernels "${kernels}" \
    --json "${out}/attention-ours.json" \
    2>&1 | tee -a "${log}" || step_failed "attention benchmark"
  python3 "${repo_root}/bench/gpu/sdpa_reference.py" --lengths "${lengths}" --json "${out}/attention-sdpa.json" \
    2>&1 | tee -a "${log}" || step_failed "torch SDPA reference"
  if [[ -f "${out}/attention-ours.json" && -f "${out}/attention-sdpa.json" ]]; then
    python3 "${repo_root}/bench/gpu/attention_report.py" --ours "${out}/attention-ours.json" \
      --sdpa "${out}/attention-sdpa.json" --date "$(date -u +%Y-%m-%d)" \
      --command "GPU_ROUND=${GPU_ROUND:-build,tests,attention,model} BENCH_LENGTHS=${lengths} scripts/gpu_round.sh" \
      --json "${out}/attention.json" --markdown "${out}/attention.md" > /dev/null &&
      rm -f "${out}/attention-ours.json" "${out}/attention-sdpa.json"  # merged into attention.json
  fi
fi

if [[ "${steps}" == *",model,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  section model
  timeout -k 10 240 "${build}/entropyinfer_gpu_bench" model --prefill "${model_prefill}" \
    --decode-contexts "${model_decode}" --json "${out}/model-ours.json" 2>&1 | tee -a "${log}" ||
    step_failed "model benchmark"
  timeout -k 10 300 python3 "${repo_root}/bench/gpu/hf_reference.py" --prefill "${model_prefill}" \
    --decode-contexts "${model_decode}" --json "${out}/model-hf.json" 2>&1 | tee -a "${log}" ||
    step_failed "transformers reference"
  if [[ -f "${out}/model-ours.json" ]]; then
    python3 "${repo_root}/bench/gpu/model_report.py" --ours "${out}/model-ours.json" --hf "${out}/model-hf.json" \
      --date "$(date -u +%Y-%m-%d)" \
      --command "GPU_ROUND=${GPU_ROUND:-build,tests,attention,model} MODEL_PREFILL=${model_prefill} MODEL_DECODE=${model_decode} scripts/gpu_round.sh" \
      --json "${out}/model.json" --markdown "${out}/model.md" > /dev/null
    rm -f "${out}/model-ours.json" "${out}/model-hf.json"  # merged into model.json
  fi
fi

if [[ "${steps}" == *",sparse,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  section sparse
  # The block-sparse kernel alone at the method's typical work (every head at the base budget),
  # per kernel of SPARSE_KERNELS (auto: bf16; fp8: over staged FP8 keys).
  for kernel in ${SPARSE_KERNELS:-auto fp8}; do
    timeout -k 10 300 "${build}/entropyinfer_gpu_bench" sparse-attention --lengths "${SPARSE_LENGTHS:-32768,65536,131072}" \
      --kernel "${kernel}" --json "${out}/sparse-attention-${kernel}.json" 2>&1 | tee -a "${log}" ||
      step_failed "sparse attention benchmark (${kernel})"
  done
fi

if [[ "${steps}" == *",gemm,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  # The model's linear products through the engine's Blas, then torch on the same shapes.
  section gemm
  # shellcheck disable=SC2086
  timeout -k 10 240 "${build}/entropyinfer_gpu_bench" gemm ${GEMM_ARGS:-} --json "${out}/gemm-ours.json" 2>&1 |
    tee -a "${log}" || step_failed "GEMM benchmark"
  timeout -k 10 120 python3 "${repo_root}/bench/gpu/matmul_reference.py" --json "${out}/gemm-torch.json" 2>&1 |
    tee -a "${log}" || step_failed "torch matmul reference"
fi

if [[ "${steps}" == *",fp8scales,"* ]]; then
  # cuBLASLt's FP8 matmul at decode-batch sizes in its scale modes (a standalone probe).
  section fp8scales
  mkdir -p "${build}"
  if nvcc -O2 -std=c++17 -arch=sm_90a -o "${build}/fp8_scale_modes_probe" \
    "${repo_root}/bench/gpu/fp8_scale_modes_probe.cu" -lcublasLt 2>&1 | tee -a "${log}"; then
    # shellcheck disable=SC2086
    timeout -k 10 240 "${build}/fp8_scale_modes_probe" ${FP8_SCALE_ROWS:-16 32 64} 2>&1 |
      tee -a "${log}" || step_failed "FP8 scale-mode probe"
  else
    step_failed "FP8 scale-mode probe build"
  fi
fi

if [[ "${steps}" == *",trace,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  # Which kernels of a decode step sit above their floor: per kernel launches, mean and added time.
  section trace
  for variant in ${TRACE_VARIANTS:-bf16 fp8}; do
    formats=()
    [[ "${variant}" == fp8 ]] && formats=(--weights fp8 --kv-cache fp8)
    timeout -k 10 300 "${build}/entropyinfer_gpu_bench" model "${formats[@]}" --prefill '' \
      --decode-contexts "${TRACE_CONTEXTS:-32768}" --kernel-trace "${OUT}/trace-${variant}.json" 2>&1 |
      tee -a "${log}" || step_failed "kernel trace (${variant})"
  done
fi

if [[ "${steps}" == *",matchprobe,"* ]]; then
  # Key matching on token ids (training/smoke/match_probe.py): which needle format, depth and
  # recipe let a small model match a key among several needles.
  section matchprobe
  # shellcheck disable=SC2086
  timeout -k 10 560 python3 -u "${repo_root}/training/smoke/match_probe.py" \
    --seconds "${MATCH_PROBE_SECONDS:-150}" \
    ${MATCH_PROBE_ARGS:---batch 512 --length 160 --hidden 384 --layers 6 --heads 6 --kv-heads 2 --min-needles 2 --max-needles 6 --questions 6 --lm-weight 1 --lr 2e-3} \
    --sweep "${MATCH_PROBE_SWEEP:---format adjacent;--format recall;--format question}" 2>&1 |
    tee -a "${log}" || step_failed "match probe"
fi

if [[ "${steps}" == *",smpartition,"* ]]; then
  # A memory stream on a few multiprocessors beside GEMMs on the rest (green contexts; a
  # standalone probe): what running a decode step beside a prefill slice could gain.
  section smpartition
  mkdir -p "${build}"
  if nvcc -O2 -std=c++17 -arch=sm_90a -o "${build}/sm_partition_probe" \
    "${repo_root}/bench/gpu/sm_partition_probe.cu" -lcublas -lcuda 2>&1 | tee -a "${log}"; then
    # shellcheck disable=SC2086
    timeout -k 10 180 "${build}/sm_partition_probe" ${SM_PARTITION_COUNTS:-16 24 32 48} 2>&1 |
      tee -a "${log}" || step_failed "SM partition probe"
  else
    step_failed "SM partition probe build"
  fi
fi

if [[ "${steps}" == *",fp8,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  # FP8 against bf16 in one call: products (the gemm step's JSON, run it first), the whole model
  # in both formats, and the methods end to end in both formats next to transformers' bf16.
  section fp8
  # Variants: bf16, FP8 projections, and FP8 projections with the FP8 KV cache ("fp8-cache").
  for variant in bf16 fp8 fp8-cache; do
    weights="${variant%-cache}" cache=bf16
    [[ "${variant}" == *-cache ]] && cache=fp8
    timeout -k 10 240 "${build}/entropyinfer_gpu_bench" model --weights "${weights}" --kv-cache "${cache}" \
      --prefill "${FP8_PREFILL:-131072}" --decode-contexts "${model_decode}" \
      --json "${out}/fp8-model-${variant}.json" 2>&1 | tee -a "${log}" ||
      step_failed "model benchmark (${variant})"
  done
  for variant in as-stored fp8 fp8-cache; do
    weights="${variant%-cache}" cache=auto
    [[ "${variant}" == *-cache ]] && cache=fp8
    timeout -k 10 300 "${build}/entropyinfer" bench --device cuda --random-model llama-3.1-8b \
      -p "${FP8_METHOD_LENGTHS:-130816}" -n "${new_tokens}" -r 1 --methods "${FP8_METHODS:-full,entropy+latent}" \
      --weights "${weights}" --kv-cache "${cache}" --json "${out}/fp8-methods-${variant}.json" 2>&1 |
      tee -a "${log}" || step_failed "methods benchmark (${variant})"
  done
  timeout -k 10 300 python3 "${repo_root}/bench/gpu/hf_reference.py" --prefill "" --decode-contexts "" \
    --e2e "${FP8_METHOD_LENGTHS:-130816}" --new-tokens "${new_tokens}" --json "${out}/fp8-hf.json" 2>&1 |
    tee -a "${log}" || step_failed "transformers reference (fp8)"
  python3 "${repo_root}/bench/gpu/fp8_report.py" --gemm "${out}/gemm-ours.json" \
    --model-bf16 "${out}/fp8-model-bf16.json" --model-fp8 "${out}/fp8-model-fp8.json" \
    --methods-bf16 "${out}/fp8-methods-as-stored.json" --methods-fp8 "${out}/fp8-methods-fp8.json" \
    --model-fp8-cache "${out}/fp8-model-fp8-cache.json" --methods-fp8-cache "${out}/fp8-methods-fp8-cache.json" \
    --hf "${out}/fp8-hf.json" --date "$(date -u +%Y-%m-%d)" \
    --command "GPU_ROUND=${GPU_ROUND:-} scripts/gpu_round.sh" --json "${out}/fp8.json" --markdown "${out}/fp8.md" |
    tee -a "${log}" || step_failed "FP8 report"
fi

if [[ "${steps}" == *",tuning,"* && -x "${build}/entropyinfer" ]]; then
  # The same prefills under each way of choosing the products' algorithms, one process per mode
  # (a model keeps the choices its first whole chunk made), with the GPU's power and clock.
  section tuning
  tuning_modes="${TUNING_MODES:-heuristic,burst,sustained}"
  for mode in ${tuning_modes//,/ }; do
    start_power_log "tuning-${mode}"
    timeout -k 10 300 "${build}/entropyinfer" bench --device cuda --random-model llama-3.1-8b \
      -p "${TUNING_LENGTH:-130816}" -n 16 -r "${TUNING_REPS:-2}" \
      --methods "${TUNING_METHODS:-entropy+latent,full}" --gemm-tuning "${mode}" --stage-times \
      --json "${out}/tuning-${mode}.json" 2>&1 | tee -a "${log}" || step_failed "tuning ${mode}"
    stop_power_log "tuning-${mode}"
  done
fi

if [[ "${steps}" == *",profile,"* && -x "${build}/entropyinfer" ]]; then
  # One decode step per method (step PROFILE_STEP of a 4096-token prompt; the latent methods have
  # compressed by then), or one prefill with PROFILE_PREFILL, every kernel timed alone by Nsight
  # Compute: where a step's or a prefill's time goes.
  section profile
  ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  if [[ -n "${ncu_bin}" ]]; then
    if [[ -n "${PROFILE_PREFILL:-}" ]]; then
      # One whole prefill of PROFILE_PREFILL tokens per method instead, the matrix products left
      # out (their time is in --stage-times): the estimate's and attention's kernels one by one.
      profile_target=(-p "${PROFILE_PREFILL}" -n 1 --profile-prefill)
      ncu_filter=(--kernel-name "regex:embedding|rms|rope|append|extrema|midpoint|epilogue|score|entropy|budget|select|keys_read|flash|swiglu|argmax")
    else
      profile_target=(-p "${PROFILE_PROMPT:-4096}" -n 40 --profile-decode-step "${PROFILE_STEP:-30}")
      ncu_filter=()
    fi
    timeout -k 10 300 "${ncu_bin}" --profile-from-start off --clock-control none "${ncu_filter[@]}" \
      --metrics gpu__time_duration.sum --csv --log-file "${out}/profile-ncu.csv" \
      "${build}/entropyinfer" bench --device cuda --random-model llama-3.1-8b -r 1 \
      "${profile_target[@]}" --methods "${PROFILE_METHODS:-entropy+latent,full}" ${PROFILE_ARGS:-} \
      2>&1 | tail -4 | tee -a "${log}" || step_failed "profile"
    python3 "${repo_root}/bench/gpu/kernel_profile.py" "${out}/profile-ncu.csv" 2>&1 | tee -a "${log}" ||
      step_failed "profile summary"
  else
    echo "no ncu on this machine" | tee -a "${log}"
  fi
fi

if [[ "${steps}" == *",needle,"* && -x "${build}/entropyinfer" ]]; then
  # The README's main job (scripts/demo.sh) on the GPU: the shipped model answers a needle question
  # over a 16k- and a 32k-token document with each method (NEEDLE_METHODS).
  section needle
  for length in 16k 32k; do
    timeout -k 10 300 "${build}/entropyinfer" needle -m "${repo_root}/models/needle-llama-11m" \
      --device cuda --length "${length}" --text-dir "${TEXT_DIR:-${repo_root}/.cache/assets-text}" \
      --methods "${NEEDLE_METHODS:-full,entropy+latent,critiprefill+snapkv}" \
      --json "${out}/needle-${length}.json" 2>&1 | tee -a "${log}" || step_failed "needle ${length}"
  done
fi

if [[ "${steps}" == *",inspect,"* && -x "${build}/entropyinfer" ]]; then
  # inspect's heatmaps on the GPU for a 128k-class prompt: INSPECT_PROMPT, default
  # .cache/prompt-130k.txt (carry it), made by
  #   cat ../shared/assets/text/janeausten/{northanger_abbey,persuasion}.txt | head -c 465000
  # (130,283 tokens). The shipped model's weights with the context opened to 131072 positions: the
  # plans' shapes and the time are what is shown, not answers.
  section inspect
  model_128k=/tmp/needle-llama-11m-128k
  mkdir -p "${model_128k}"
  for file in "${repo_root}"/models/needle-llama-11m/*; do ln -sf "${file}" "${model_128k}/"; done
  rm -f "${model_128k}/config.json"
  sed 's/"max_position_embeddings": 32768/"max_position_embeddings": 131072/' \
    "${repo_root}/models/needle-llama-11m/config.json" > "${model_128k}/config.json"
  start=$(date +%s)
  /usr/bin/time -f "inspect 128k: %e s wall, %M KiB peak host memory" \
    timeout -k 10 300 "${build}/entropyinfer" inspect -m "${model_128k}" --device cuda --prefill entropy \
    -f "${INSPECT_PROMPT:-${repo_root}/.cache/prompt-130k.txt}" --no-blocks -o "${out}/inspect-128k" \
    2>&1 | tee -a "${log}" || step_failed "inspect 128k"
  summary+=("inspect 128k: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",capacity,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  # The longest prompt one H200 holds per method (Llama-3.1-8B shape), found by constructing the
  # engine; long: the full-attention prompt alone is capped at CAPACITY_PREFILL_SECONDS.
  section capacity
  timeout -k 10 "${CAPACITY_TIMEOUT:-560}" "${build}/entropyinfer_gpu_bench" capacity \
    --methods "${CAPACITY_METHODS:-full,entropy+snapkv}" \
    --max-prefill-seconds "${CAPACITY_PREFILL_SECONDS:-300}" --json "${out}/capacity.json" 2>&1 |
    tee -a "${log}" || step_failed "capacity"
fi

if [[ "${steps}" == *",serve,"* && -x "${build}/entropyinfer_gpu_bench" ]]; then
  # The serving scheduler under load on the CUDA batch executor (Llama-3.1-8B shape, random
  # weights; carry .cache/tokenizers/llama3). SERVE_SCENARIOS, SERVE_METHODS, SERVE_ARGS.
  section serve
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 10 "${SERVE_TIMEOUT:-560}" "${build}/entropyinfer_gpu_bench" serve \
    --tokenizer "${repo_root}/.cache/tokenizers/llama3/tokenizer.json" \
    --methods "${SERVE_METHODS:-full,entropy+snapkv,entropy+latent}" \
    --scenario "${SERVE_SCENARIOS:-floor,long,streams,interference}" ${SERVE_ARGS:-} \
    --json "${out}/serve.json" 2>&1 | tee -a "${log}" || step_failed "serve"
  summary+=("serve: $(( $(date +%s) - start )) s")
fi

if [[ "${steps}" == *",methods,"* && -x "${build}/entropyinfer" ]]; then
  section methods
  stage_flag=""
  [[ "${METHOD_STAGE_TIMES:-0}" == 1 ]] && stage_flag="--stage-times"
  start_power_log methods
  timeout -k 10 420 "${build}/entropyinfer" bench --device cuda --random-model llama-3.1-8b \
    -p "${method_lengths}" -n "${new_tokens}" -r "${METHOD_REPS:-1}" --methods "${methods}" ${stage_flag} \
    ${METHOD_ARGS:-} --json "${out}/methods-ours.json" 2>&1 | tee -a "${log}" ||
    step_failed "methods benchmark"
  stop_power_log methods
  if [[ "${METHODS_HF:-1}" == 1 ]]; then
    timeout -k 10 420 python3 "${repo_root}/bench/gpu/hf_reference.py" --prefill "${method_lengths}" \
      --decode-contexts "" --e2e "${method_lengths}" --new-tokens "${new_tokens}" \
      --json "${out}/methods-hf.json" 2>&1 | tee -a "${log}" || step_failed "transformers reference (methods)"
  fi
  if [[ -f "${out}/methods-ours.json" ]]; then
    hf_args=()
    [[ -f "${out}/methods-hf.json" ]] && hf_args=(--hf "${out}/methods-hf.json")
    python3 "${repo_root}/bench/gpu/methods_report.py" --ours "${out}/methods-ours.json" "${hf_args[@]}" \
      --markdown "${out}/methods.md" --json "${out}/methods.json" > /dev/null &&
      rm -f "${out}/methods-ours.json" "${out}/methods-hf.json"  # merged into methods.json
    if [[ -n "${stage_flag}" && -f "${out}/methods.json" ]]; then
      python3 "${repo_root}/bench/gpu/stage_plot.py" --methods "${out}/methods.json" \
        --svg "${out}/prefill-by-part.svg" || step_failed "prefill plot"
    fi
  fi
fi

if [[ "${steps}" == *",bench,"* && -x "${build}/entropyinfer" ]]; then
  section bench
  # llama-bench-style: dense attention chunk by chunk and layer by layer.
  timeout -k 10 300 "${build}/entropyinfer" bench --device cuda --random-model llama-3.1-8b \
    -p "${cli_lengths}" -n 32 -r 1 --methods full,full@layer \
    --json "${out}/bench.json" --markdown "${out}/bench.md" 2>&1 | tee -a "${log}" ||
    step_failed "entropyinfer bench --device cuda"
fi

echo
printf '%s\n' "${summary[@]}" | tee -a "${log}"
[[ -f "${out}/attention.md" ]] && cat "${out}/attention.md"
[[ -f "${out}/model.md" ]] && cat "${out}/model.md"
[[ -f "${out}/methods.md" ]] && cat "${out}/methods.md"
[[ -f "${out}/bench.md" ]] && cat "${out}/bench.md"
exit "${status}"
