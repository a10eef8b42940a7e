#!/usr/bin/env bash
# CPU speed round: prefill and decode tokens/s on stories260K and on a ~100M-parameter random Llama,
# each next to the memory-bandwidth floor measured in the same run. Writes JSON and a markdown table
# under bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build entropyinfer
day=$(date -u +%Y-%m-%d)
out=bench/results
mkdir -p "$out"
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
report="$out/cpu-$day.md"
note="stories260K's 1 MiB of weights stays in the CPU caches, so its DRAM floor is not a real bound; the
100M model's weights (382 MiB read per token) are."
{
  echo "# CPU benchmark, $day"
  echo
  echo "Machine: $machine. Commands below; decode floor = (weight bytes + KV bytes read per token) /"
  echo "memory copy bandwidth measured in the same run. $note"
  echo
} >"$report"
stories=../shared/assets/stories260K/stories260K.bin
if [[ -f $stories ]]; then
  command="build/entropyinfer bench -m $stories -p 32,256 -n 128 -r 5 --json $out/cpu-$day-stories260K.json"
  echo "\`$command\`" >>"$report"; echo >>"$report"
  $command | tee -a "$report"
  echo >>"$report"
fi
command="build/entropyinfer bench --random-model llama-100m -p 128,512 -n 32 -r 3 --json $out/cpu-$day-llama-100m.json"
echo "\`$command\`" >>"$report"; echo >>"$report"
$command | tee -a "$report"
echo "wrote $report"
