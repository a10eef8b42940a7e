#!/usr/bin/env bash
# Decode step A/B on the GPU machine: this tree against the same tree with a patch reversed (the
# change under test), built side by side and run alternately on the same card, so that the
# comparison holds no drift between calls. Writes ab-decode.log (ab-decode-LABEL.log) and one JSON
# per run into $OUT.
#   OUT             output folder (the device run sets it)
#   AB_PATCH        the change under test, as `git diff` writes it (required; in the tree)
#   AB_ROUNDS       alternations of base and change (default 2)
#   AB_LABEL        names this A/B's log, JSON and base tree (ab-decode-LABEL.log ...), so that one
#                   call can run several (default: none)
#   AB_CONTEXTS     decode contexts (default 32768,131072)
#   AB_FORMATS      bench flags of the runs (default "--weights fp8 --kv-cache fp8"); bf16 runs
#                   once per tree besides when AB_BF16=1 (default)
# The tree's own build goes through scripts/gpu_round.sh (GPU_ROUND=build or more, run first).
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:?set OUT}"
patch_file="${AB_PATCH:?set AB_PATCH to the change under test}"
suffix="${AB_LABEL:+-${AB_LABEL}}"
log="${out}/ab-decode${suffix}.log"
base="/tmp/ab-base${suffix}"
rm -rf "${base}" && mkdir -p "${base}"
(cd "${repo_root}" && tar --exclude=./build-gpu --exclude=./.git -cf - .) | (cd "${base}" && tar -xf -)
if ! (cd "${base}" && patch -R -p1 --quiet < "${repo_root}/${patch_file}"); then
  echo "the patch does not reverse cleanly" | tee -a "${log}"
  exit 1
fi
OUT="${base}-out" GPU_ROUND=build BUILD_TARGETS=entropyinfer_gpu_bench bash "${base}/scripts/gpu_round.sh" \
  > /dev/null 2>&1 || { echo "base build failed" | tee -a "${log}"; tail -30 "${base}-out/round.log" >> "${log}"; exit 1; }
contexts="${AB_CONTEXTS:-32768,131072}"
read -r -a formats <<< "${AB_FORMATS:---weights fp8 --kv-cache fp8}"
run() {  # run TREE LABEL FLAGS...
  local tree=$1 label=$2${suffix}
  shift 2
  echo "== ${label}" | tee -a "${log}"
  if ! timeout -k 10 240 "${tree}/build-gpu/entropyinfer_gpu_bench" model "$@" --prefill '' \
    --decode-contexts "${contexts}" --json "${out}/ab-${label}.json" > "/tmp/ab-${label}.out" 2>&1; then
    echo "FAILED: ${label}" | tee -a "${log}"
    tail -20 "/tmp/ab-${label}.out" >> "${log}"
  fi
  grep -i "decode" "/tmp/ab-${label}.out" | tee -a "${log}"
}
if [[ "${AB_BF16:-1}" == 1 ]]; then
  run "${base}" base-bf16
  run "${repo_root}" change-bf16
fi
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  run "${base}" "base-${round}" "${formats[@]}"
  run "${repo_root}" "change-${round}" "${formats[@]}"
done
