#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input (fuzz/) for a bounded time: builds the libFuzzer targets
# with clang, ASan and UBSan in build-fuzz, assembles each target's seed corpus from the test
# fixtures, the shared assets (when present), fuzz/seeds and fuzz/regressions, then runs every target
# for the given seconds, two at a time. Prints one line per target as it finishes, writes
# build-fuzz/summary.md, and exits non-zero when any target crashed, naming the file that reproduces
# it. Usage: scripts/fuzz.sh [seconds_per_target] (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [seconds_per_target]" >&2
  exit 2
fi
parallel="${ENTROPYINFER_FUZZ_JOBS:-2}"
assets="${ENTROPYINFER_ASSETS_DIR:-../shared/assets}"
build="build-fuzz"
fixtures=tests/fixtures

echo "fuzz: building the fuzz targets in ${build} (log: ${build}/build.log)"
mkdir -p "${build}"
if ! { CC=clang CXX=clang++ cmake -S . -B "${build}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DENTROPYINFER_FUZZ=ON -DENTROPYINFER_BUILD_TESTS=OFF &&
  ninja -C "${build}" entropyinfer_fuzzers; } >"${build}/build.log" 2>&1; then
  tail -n 40 "${build}/build.log"
  echo "fuzz: the build failed" >&2
  exit 1
fi

# target:max_len (bytes). Tokenizer and weight files get room for the real files used as seeds.
targets=(
  safetensors_header:1048576
  safetensors_index:65536
  config_json:16384
  tokenizer_json:1048576
  sentencepiece_model:1048576
  tiktoken:65536
  llama2c_checkpoint:4096
  llama2c_tokenizer:1048576
  attention_config:4096
  openai_request:65536
  eval_report:16384
)
json_targets=" safetensors_header safetensors_index config_json tokenizer_json attention_config openai_request eval_report "

# Seeds are rebuilt on every run; the corpus (what the fuzzer found) stays between local runs.
rm -rf "${build}/seeds" "${build}/crashes" "${build}/results"
mkdir -p "${build}/seeds" "${build}/crashes" "${build}/results" "${build}/logs"
python3 fuzz/make_seeds.py "${build}/seeds"
# copy_seed TARGET FILE [NAME]: adds FILE, when present, to TARGET's seeds.
copy_seed() {
  [[ -f $2 ]] || return 0
  mkdir -p "${build}/seeds/$1"
  cp "$2" "${build}/seeds/$1/${3:-$(basename "$2")}"
}
for file in "${fixtures}"/parity/*/*.safetensors; do
  copy_seed safetensors_header "${file}" "$(basename "$(dirname "${file}")")-$(basename "${file}")"
done
for folder in "${fixtures}"/parity/*/; do
  name=$(basename "${folder}")
  copy_seed safetensors_index "${folder}model.safetensors.index.json" "${name}.json"
  copy_seed config_json "${folder}config.json" "${name}.json"
done
copy_seed tokenizer_json "${fixtures}/ruler/tokenizer.json" ruler.json
copy_seed tokenizer_json "${fixtures}/parity/tiny_chat_llama/tokenizer.json" tiny_chat_llama.json
copy_seed sentencepiece_model "${assets}/tokenizers/llama2/tokenizer.model" llama2.model
copy_seed sentencepiece_model \
  "${assets}/tokenizers/mistral/mistral_instruct_tokenizer_240323.model.v3" mistral_v3.model
copy_seed llama2c_tokenizer "${assets}/tokenizers/llama2/tokenizer.bin" llama2.bin
copy_seed llama2c_tokenizer "${assets}/stories260K/tok512.bin"
# The full rank files are megabytes; their first 400 lines hold the 256 byte tokens and some merges.
for file in qwen/qwen.tiktoken llama3/tokenizer.model; do
  if [[ -f ${assets}/tokenizers/${file} ]]; then
    head -n 400 "${assets}/tokenizers/${file}" >"${build}/seeds/tiktoken/${file%%/*}_head.tiktoken"
  fi
done

# run_target TARGET MAX_LEN: fuzzes one target and prints its line; its result goes to results/.
run_target() {
  local target=$1 max_len=$2
  local corpus="${build}/corpus/${target}" crashes="${build}/crashes/${target}"
  local log="${build}/logs/${target}.log"
  mkdir -p "${corpus}" "${crashes}" "${build}/seeds/${target}"
  local extra_dirs=()
  for dir in "fuzz/seeds/${target}" "fuzz/regressions/${target}"; do
    if [[ -d ${dir} ]]; then extra_dirs+=("${dir}"); fi
  done
  local options=(-max_total_time="${seconds}" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len}"
    -print_final_stats=1 -artifact_prefix="${crashes}/")
  if [[ ${json_targets} == *" ${target} "* ]]; then options+=(-dict=fuzz/json.dict); fi
  local start=${SECONDS} status=0
  "${build}/${target}_fuzzer" "${options[@]}" "${corpus}" "${build}/seeds/${target}" \
    "${extra_dirs[@]}" >"${log}" 2>&1 || status=$?
  local elapsed=$((SECONDS - start))
  local executions
  executions=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "${log}" | tail -n 1)
  executions=${executions:-?}
  local artifact
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "${log}" | tail -n 1)
  if ((status == 0)); then
    echo "${target} ${elapsed} ${executions} 0 -" >"${build}/results/${target}"
    printf 'fuzz: %-20s %10s executions in %3d s, no crash\n' "${target}" "${executions}" \
      "${elapsed}"
  else
    echo "${target} ${elapsed} ${executions} 1 ${artifact:-${log}}" >"${build}/results/${target}"
    printf 'fuzz: %-20s %10s executions in %3d s, CRASHED (exit %d): %s (log: %s)\n' "${target}" \
      "${executions}" "${elapsed}" "${status}" "${artifact:-no reproducer written}" "${log}"
  fi
}

echo "fuzz: ${#targets[@]} targets, ${seconds} s each, ${parallel} at a time (logs: ${build}/logs)"
running=0
for entry in "${targets[@]}"; do
  if ((running >= parallel)); then
    wait -n
    running=$((running - 1))
  fi
  run_target "${entry%%:*}" "${entry##*:}" &
  running=$((running + 1))
done
wait

# result_of TARGET: its line from results/ (a job that died without one counts as a crash).
result_of() {
  if [[ -f ${build}/results/$1 ]]; then
    cat "${build}/results/$1"
  else
    echo "$1 ? ? 1 (the job ended without a result)"
  fi
}
crashed=0
{
  echo "| target | seconds | executions | crashes |"
  echo "|---|---:|---:|---:|"
  for entry in "${targets[@]}"; do
    read -r target elapsed executions crashes artifact < <(result_of "${entry%%:*}")
    echo "| ${target} | ${elapsed} | ${executions} | ${crashes} |"
    crashed=$((crashed + crashes))
  done
  if ((crashed > 0)); then
    echo
    echo "Reproducers (run \`${build}/<target>_fuzzer FILE\` to replay one):"
    for entry in "${targets[@]}"; do
      read -r target elapsed executions crashes artifact < <(result_of "${entry%%:*}")
      if ((crashes > 0)); then echo "- ${target}: ${artifact}"; fi
    done
  fi
} >"${build}/summary.md"
cat "${build}/summary.md"
if ((crashed > 0)); then
  echo "fuzz: ${crashed} target(s) crashed; minimise the reproducer and keep it in" \
    "fuzz/regressions/<target>/" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds} s without a crash"
