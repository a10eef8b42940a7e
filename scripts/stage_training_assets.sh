#!/usr/bin/env bash
# Copy the text and word lists that training/train.py reads into .cache/assets-text (ignored by git),
# so that they can travel to the GPU machine: name .cache/assets-text in the device run's carry.
# Only what training uses is copied (about 11 MB): the Austen novels, the KJV, bAbI's English training
# files and RULER's wonderwords lists, with their licence notes. Idempotent: the folder is rebuilt.
#   ASSETS  the shared assets folder (default: ../shared/assets beside the repository)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${ASSETS:-${root}/../shared/assets}"
dest="${root}/.cache/assets-text"
for needed in text/janeausten/emma.txt text/kjv/kjv_bible.txt text/babi/en ruler/wonderwords_nounlist.txt; do
  if [[ ! -e "${src}/${needed}" ]]; then
    echo "stage_training_assets: ${src}/${needed} is missing" >&2
    exit 1
  fi
done

tmp="${dest}.tmp"
rm -rf "${tmp}"
mkdir -p "${tmp}/janeausten" "${tmp}/kjv" "${tmp}/babi/en" "${tmp}/ruler"
cp -r "${src}"/text/janeausten/. "${tmp}/janeausten/"
cp -r "${src}"/text/kjv/. "${tmp}/kjv/"
cp "${src}"/text/babi/en/qa*_train.txt "${tmp}/babi/en/"
cp "${src}"/text/babi/LICENSE.txt "${src}"/text/babi/README.txt "${tmp}/babi/"
cp "${src}"/ruler/wonderwords_*.txt "${src}"/ruler/LICENSE.wonderwords "${tmp}/ruler/"
chmod -R u+w "${tmp}"  # the shared copies are read-only; the staged ones must be replaceable
rm -rf "${dest}"
mv "${tmp}" "${dest}"
echo "staged $(du -sh "${dest}" | cut -f1) in ${dest}"
