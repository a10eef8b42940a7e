#!/usr/bin/env bash
# CPU round on a real-size bf16 checkpoint (default: the Llama-3.1-8B shape, 16 GB in 4 shards, random
# weights, written by scripts/make_random_checkpoint.py when the folder is missing): `generate` reports
# the host's anonymous memory (RssAnon: the checkpoint is memory-mapped and computed with as stored,
# so it should hold only the KV cache and scratch), and `bench` decodes next to the memory-bandwidth
# floor measured in the same run. Writes bench/results/cpu-<date>-checkpoint-<shape>.md and .json.
#   scripts/bench_checkpoint_cpu.sh [FOLDER] [SHAPE]   (defaults /tmp/llama-3.1-8b-bf16, llama-3.1-8b)
set -euo pipefail
cd "$(dirname "$0")/.."
folder="${1:-/tmp/llama-3.1-8b-bf16}"
shape="${2:-llama-3.1-8b}"
if [[ ! -f ${folder}/config.json ]]; then
  scripts/fetch_tokenizers.sh >/dev/null
  python3 scripts/make_random_checkpoint.py "${folder}" --shape "${shape}" \
    --tokenizer .cache/tokenizers/llama3/tokenizer.json
fi
[[ -x build/entropyinfer ]] || { cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  ninja -C build entropyinfer; }
day=$(date -u +%Y-%m-%d)
out=bench/results
report="${out}/cpu-${day}-checkpoint-${shape}.md"
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
size=$(du -sh --apparent-size "${folder}" | cut -f1)
generate=(build/entropyinfer generate -m "${folder}" -p "The harbour log of the north pier says" -n 8
  --ignore-eos)
bench=(build/entropyinfer bench -m "${folder}" -p 16 -n 8 -r 2 --json "${out}/cpu-${day}-checkpoint-${shape}.json")
echo "generate: ${generate[*]}" >&2
"${generate[@]}" >/tmp/checkpoint-cpu-generate.txt 2>/tmp/checkpoint-cpu-generate.err
grep -E "model ready|prompt tokens" /tmp/checkpoint-cpu-generate.err >&2
echo "bench: ${bench[*]}" >&2
table=$("${bench[@]}")
{
  echo "# CPU: a ${size} bf16 checkpoint (${shape} shape, random weights), ${day}"
  echo
  echo "Machine: ${machine}. The checkpoint is memory-mapped and its matrices computed with as stored"
  echo "(bf16, fp32 sums), so host anonymous memory holds the KV cache and scratch only; the file's pages"
  echo "are page cache. Decode floor = (weight bytes + KV bytes read per token) / memory copy bandwidth"
  echo "measured in the same run."
  echo
  echo "\`${generate[*]}\`"
  echo
  echo '```'
  grep -E "model ready|prompt tokens" /tmp/checkpoint-cpu-generate.err
  echo '```'
  echo
  echo "\`${bench[*]}\`"
  echo
  echo "${table}"
} >"${report}"
cat "${report}"
echo "wrote ${report}" >&2
