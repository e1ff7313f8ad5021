#!/usr/bin/env bash
# The tree's C++ and CUDA sources against .clang-format (Debian 12's clang-format 14).
#   tools/format.sh          reformat every tracked .h/.cc/.cu/.cuh/.c in place
#   tools/format.sh --check  change nothing; list the files that differ and exit 1 if any does
# third_party/ is left as it came.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "tools/format.sh: clang-format is missing (apt-get install clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' '*.c' | grep -v '^third_party/')
if [ "${1:-}" = "--check" ]; then
  differ=0
  for f in "${files[@]}"; do
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then
      echo "not formatted: $f (tools/format.sh formats it)"
      differ=1
    fi
  done
  [ "$differ" = 0 ] && echo "format: ${#files[@]} files match .clang-format"
  exit "$differ"
fi
clang-format --style=file -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
