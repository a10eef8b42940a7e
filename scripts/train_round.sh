#!/usr/bin/env bash
# One training round of the project's small long-context model on the GPU machine (one H200):
# checks the task generator, then runs training/train.py (tokenizer, training by wall clock,
# checkpoints, export, evaluation). Everything lands flat in $OUT, at most 8 files:
#   model.tar.00, model.tar.01  the model folder, bundled (`cat model.tar.* | tar -x` gives model/)
#   train_state.json, eval.json, eval_manifest.jsonl, train.log (and side-train.log)
# The whole round takes about 8 minutes (training stops by wall clock; see training/README.md).
#   OUT          output folder (the device run sets it)
#   RESUME_FROM  optional: a previous round's output (folder with model.tar.* and train_state.json),
#                carried into the repository, e.g. .cache/round1, or kept on a warm machine by
#                the call before (KEEP_ROUND)
#   KEEP_ROUND   optional: also copy this round's model.tar.* and train_state.json to this ignored
#                folder of the repository (e.g. .cache/kept-round). A device machine keeps ignored
#                paths between calls while it stays warm, so the next call can resume from there
#                without carrying a model that would not fit beside the tree
#   TEXT_DIR     training text (default .cache/assets-text, from scripts/stage_training_assets.sh)
#   TRAIN_ARGS   extra arguments for training/train.py, e.g. "--train-seconds 300"
#   SIDE_TRAIN_ARGS  optional: a second train.py run, side by side on the same GPU, with these
#                arguments (and RESUME_FROM, TEXT_DIR); only its log comes back, as side-train.log,
#                so that one call compares two recipes (the small model leaves the GPU mostly idle)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
out="${OUT:?set OUT to the folder that receives the model and the logs}"
text_dir="${TEXT_DIR:-.cache/assets-text}"
mkdir -p "${out}"
export PYTHONUNBUFFERED=1

if [[ ! -f "${text_dir}/janeausten/emma.txt" ]]; then
  echo "train_round: no training text in ${text_dir}: run scripts/stage_training_assets.sh and carry .cache/assets-text" >&2
  exit 1
fi

# Shared by the main run and the side run; each adds its own --out.
args=(--text-dir "${text_dir}")
if [[ -n "${RESUME_FROM:-}" ]]; then
  if ! compgen -G "${RESUME_FROM}/model.tar.*" > /dev/null || [[ ! -f "${RESUME_FROM}/train_state.json" ]]; then
    echo "train_round: RESUME_FROM=${RESUME_FROM} holds no model.tar.* and train_state.json here: carry it, or run right after the call that kept it (KEEP_ROUND) while the machine is warm" >&2
    exit 1
  fi
  args+=(--resume-from "${RESUME_FROM}")
fi

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) train_round on $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c 'import sys, torch, tokenizers, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "tokenizers", tokenizers.__version__, "transformers", transformers.__version__)' || true
  python3 training/tasks.py --self-test --text-dir "${text_dir}"
  side_pid=""
  if [[ -n "${SIDE_TRAIN_ARGS:-}" ]]; then
    side_out="$(mktemp -d)"
    # shellcheck disable=SC2086
    python3 -u training/train.py --out "${side_out}" "${args[@]}" ${SIDE_TRAIN_ARGS} > "${out}/side-train.log" 2>&1 &
    side_pid=$!
    echo "side run (pid ${side_pid}): ${SIDE_TRAIN_ARGS}"
  fi
  # TRAIN_ARGS is split into words on purpose.
  # shellcheck disable=SC2086
  python3 -u training/train.py --out "${out}" "${args[@]}" ${TRAIN_ARGS:-}
  if [[ -n "${side_pid}" ]]; then
    wait "${side_pid}" || echo "side run failed: see side-train.log"
    sed -n '/=== summary ===/,$p' "${out}/side-train.log"
  fi
} 2>&1 | tee "${out}/train.log"

if [[ -n "${KEEP_ROUND:-}" ]]; then
  rm -rf "${KEEP_ROUND}"
  mkdir -p "${KEEP_ROUND}"
  cp "${out}"/model.tar.* "${out}/train_state.json" "${KEEP_ROUND}/"
  echo "train_round: kept the model in ${KEEP_ROUND} for the next call on this machine" | tee -a "${out}/train.log"
fi
