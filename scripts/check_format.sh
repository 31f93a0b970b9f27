#!/usr/bin/env bash
# The formatting check (docs/checks.md): every tracked C++, CUDA and HIP source must be exactly
# what clang-format-14 (the pinned version; .clang-format holds the style) makes of it. Prints
# each offending file with the diff that would fix it and exits 1; fix with
#   git ls-files -z -- '*.cc' '*.h' '*.cu' '*.cuh' '*.hip' | xargs -0 clang-format-14 -i
# Usage: scripts/check_format.sh   (CLANG_FORMAT: another binary, at your own risk: other
# versions format differently)
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$clang_format" > /dev/null; then
  echo "check_format: $clang_format not found (scripts/install_deps.sh installs it)" >&2
  exit 2
fi
files=()
while IFS= read -r -d '' f; do files+=("$f"); done < \
  <(git ls-files -z -- '*.cc' '*.h' '*.cu' '*.cuh' '*.hip')
bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --style=file "$f" |
       diff -u --label "$f" --label "$f (clang-format-14)" "$f" -; then
    bad+=("$f")
  fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not clang-format-14 clean:" >&2
  printf 'check_format:   %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clean ($("$clang_format" --version | grep -o 'version [0-9.]*'))"
