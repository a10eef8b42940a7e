#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and asks the project's own trained
# long-context model (models/needle-llama-11m) a needle question over a 16k-token document, once with
# full attention and once with EntropyInfer, printing both answers, the time to first token and the
# fraction of full attention's work each did. Extra arguments go to `entropyinfer needle` (e.g.
# --length 32k, --budget 1024, --methods full,entropy+latent,critiprefill, --index 3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build entropyinfer
model=models/needle-llama-11m
echo "== entropyinfer needle -m $model $*"
build/entropyinfer needle -m "$model" "$@"
# With the shared assets beside the checkout, also run a real pretrained model (llama2.c's stories260K).
stories=../shared/assets/stories260K
if [[ -f $stories/stories260K.bin ]]; then
  echo "== entropyinfer generate -m $stories/stories260K.bin (a real 260K-parameter TinyStories model)"
  build/entropyinfer generate -m "$stories/stories260K.bin" --tokenizer "$stories/tok512.bin" \
    -p "Once upon a time" -n 200 -t 0
fi
