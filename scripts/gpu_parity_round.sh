#!/usr/bin/env bash
# One run on the device machine (python3 with torch and transformers, no network): regenerates the Hugging
# Face parity fixtures and packs them into a single archive, since only a few files come back from there.
#   OUT           where the archive and the log go (the device run sets it)
#   PARITY_TEXT   text file for the tiny_chat_llama tokenizer (default: .cache/parity_text/persuasion.txt,
#                 copied there from ../shared/assets/text/janeausten/ before the run, as ../shared does not
#                 travel)
#   PARITY_CASES  optional comma-separated subset of cases
# Afterwards, here: tar xzf parity_fixtures.tgz -C tests/fixtures/ (the archive holds a folder "parity").
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:?set OUT to the folder that receives the archive}"
text="${PARITY_TEXT:-${repo_root}/.cache/parity_text/persuasion.txt}"
cases_arg=()
if [[ -n "${PARITY_CASES:-}" ]]; then
  cases_arg=(--cases "${PARITY_CASES}")
fi

mkdir -p "${out}"
export PYTHONUNBUFFERED=1
python3 "${repo_root}/scripts/make_parity_fixtures.py" --out "${out}/parity" --text "${text}" \
  "${cases_arg[@]}" 2>&1 | tee "${out}/parity_log.txt"
status=${PIPESTATUS[0]}

# Pack whatever was generated, even after a failed case, so that the good cases are not lost.
tar czf "${out}/parity_fixtures.tgz" -C "${out}" parity
rm -rf "${out}/parity"
ls -l "${out}"
exit "${status}"
