#!/usr/bin/env bash
# The clang-tidy check (docs/checks.md): clang-tidy-22 with the repository's .clang-tidy over
# every tracked source of a CPU build's compile_commands.json (the project's own sources: not
# the generated protobuf code, not the CUDA/HIP kernels), with clang's -Wthread-safety, so the
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations are checked too. Every finding is
# an error (.clang-tidy's WarningsAsErrors). Prints each failing file's findings; exits 1 if
# there are any.
#
# The build directory is configured with the release preset if it has no
# compile_commands.json yet; only protoc's outputs are built (the sources include them), so the
# check needs no compiled build. An existing build directory of any preset may be passed.
# Usage: scripts/tidy.sh [build-dir=build-tidy] [SOURCE...]
#   SOURCE  check only these files (relative to the repository root), e.g. the ones you touched
# Environment: SMLA_JOBS (parallel clang-tidy processes, default nproc), CLANG_TIDY (default
# clang-tidy-22, the version .clang-tidy is written for).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
build="${1:-build-tidy}"
shift || true
jobs="${SMLA_JOBS:-$(nproc)}"
clang_tidy="${CLANG_TIDY:-clang-tidy-22}"
if ! command -v "$clang_tidy" > /dev/null; then
  echo "tidy: $clang_tidy not found (scripts/install_deps.sh installs it)" >&2
  exit 2
fi
start=$SECONDS
if [ ! -f "$build/compile_commands.json" ]; then
  cmake --preset release -B "$build" > /dev/null
fi
# The generated headers the sources include (protoc's outputs), nothing else.
mapfile -t generated < <(ninja -C "$build" -t targets all |
                         sed -n -E 's/^([^:]*\.pb\.h): CUSTOM_COMMAND$/\1/p')
if [ ${#generated[@]} -gt 0 ]; then ninja -C "$build" "${generated[@]}" > /dev/null; fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# A database with one entry per source: a source compiled into several targets has several
# entries, and clang-tidy would check it once for each. Prints the sources git tracks.
mapfile -t tracked < <(
  python3 - "$build/compile_commands.json" "$root" "$out/compile_commands.json" <<'EOF'
import json, os, subprocess, sys
db, root, dedup = sys.argv[1:4]
tracked = set(subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True,
                             text=True).stdout.split())
entries = {}
for e in json.load(open(db)):
    entries.setdefault(os.path.normpath(os.path.join(e["directory"], e["file"])), e)
json.dump(list(entries.values()), open(dedup, "w"))
for f in entries:
    if os.path.relpath(f, root) in tracked:
        print(os.path.relpath(f, root))
EOF
)
files=("$@")
if [ ${#files[@]} -eq 0 ]; then files=("${tracked[@]}"); fi
if [ ${#files[@]} -eq 0 ]; then
  echo "tidy: no sources in $build/compile_commands.json" >&2
  exit 2
fi

export clang_tidy out
tidy_one() {
  local log
  log="$out/$(echo "$1" | tr '/' '_').log"
  if ! "$clang_tidy" -p "$out" --quiet "$1" > "$log" 2>&1; then
    mv "$log" "$log.failed"
  fi
}
export -f tidy_one
printf '%s\0' "${files[@]}" | xargs -0 -r -n1 -P "$jobs" bash -c 'tidy_one "$1"' _ || true

failed=("$out"/*.failed)
if [ -e "${failed[0]}" ]; then
  for f in "${failed[@]}"; do
    # The findings and their notes; clang-tidy's "N warnings generated" lines are noise.
    grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ ' "$f" ||
      true
  done
  echo "tidy: ${#failed[@]} of ${#files[@]} files have findings ($((SECONDS - start)) s)" >&2
  exit 1
fi
echo "tidy: ${#files[@]} files clean ($((SECONDS - start)) s, $jobs jobs)"
