#!/usr/bin/env bash
# CPU smoke test of the whole training pipeline (tokenizer, workers, training, checkpoint bundle,
# resume, export, evaluation) with a tiny model, on a machine without a GPU. Needs torch and numpy
# (Debian: apt-get install python3-torch python3-numpy, then PYTHON=/usr/bin/python3); uses the
# stand-in tokenizer in training/smoke/tokenizers when the real package is missing. About 3 minutes.
#   PYTHON  interpreter with torch (default python3)
#   OUT     output folder (default a new temporary folder)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3}"
out="${OUT:-$(mktemp -d /tmp/entropyinfer-smoke-XXXXXX)}"
if ! "${python}" -c 'import tokenizers' 2>/dev/null; then
  export PYTHONPATH="${root}/training/smoke${PYTHONPATH:+:${PYTHONPATH}}"
fi
tiny=(--device cpu --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 --vocab-size 2048
  --max-position 4096 --eval-samples 2 --eval-single-lengths 1024 --eval-other-length 1024 --workers 2
  --eval-workers 1 --no-hf-check --checkpoint-seconds 8 --log-seconds 4 --bundle-part-mib 0.2)
"${python}" "${root}/training/train.py" --out "${out}/first" "${tiny[@]}" --curriculum 256:0.5:8,512:0.5:4 \
  --train-seconds 20
"${python}" "${root}/training/train.py" --out "${out}/second" --resume-from "${out}/first" "${tiny[@]}" \
  --curriculum 512:1:4 --train-seconds 10 --export-folder "${out}/model"
test -f "${out}/model/model.safetensors"
test -f "${out}/second/model.tar.00"
test -f "${out}/second/eval.json"
grep -q '"total_steps"' "${out}/second/train_state.json"
echo "cpu smoke test passed: ${out}"
