#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and generates text with the default model
# that ships in the repo. Extra arguments go to `entropyinfer generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build entropyinfer
# Until the project's own trained long-context model exists, the default is a tiny random-weight Llama
# with a real byte-level BPE tokenizer and chat template (a transformers parity fixture): the text is
# noise, the pipeline (loading, chat formatting, tokenizer, decoder, sampler, streaming) is real.
model=tests/fixtures/parity/tiny_chat_llama
echo "== entropyinfer generate -m $model --chat"
build/entropyinfer generate -m "$model" --chat -p "Tell me a story about a lighthouse." -n 48 \
  -t 0.8 --top-p 0.95 --seed 42 "$@"
# With the shared assets beside the checkout, also run a real pretrained model (llama2.c's stories260K).
stories=../shared/assets/stories260K
if [[ -f $stories/stories260K.bin ]]; then
  echo "== entropyinfer generate -m $stories/stories260K.bin (a real 260K-parameter TinyStories model)"
  build/entropyinfer generate -m "$stories/stories260K.bin" --tokenizer "$stories/tok512.bin" \
    -p "Once upon a time" -n 200 -t 0
fi
