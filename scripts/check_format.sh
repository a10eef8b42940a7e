#!/usr/bin/env bash
# Fails when a C++ source differs from what clang-format (with the repo's .clang-format) would write.
# The generated Unicode tables are exempt.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'tests/*.cpp' 'tests/*.h' \
  'bench/*.cpp' 'bench/*.cu' 'fuzz/*.cpp' 'fuzz/*.h' | grep -v 'unicode_tables.cpp')
clang-format --dry-run -Werror "${files[@]}"
echo "format check: ${#files[@]} files clean"
