#!/usr/bin/env bash
# ctest's run of scripts/kernel_ab.sh on stand-in binaries (no GPU): every build's tests run,
# the timed rounds alternate the builds (a b a b), the sanitizers run on the first build only,
# the summary gives each build's range and its change against the first and lists the whole-grid
# cells of b more than 3 % slower than a's, a failing step is recorded without stopping the
# others (and fails the run), and a budget too small for a step skips it and says so.
# Usage: kernel_ab_test.sh SOURCE_DIR
set -uo pipefail
src_dir="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A stand-in smla-kbench: logs its build and writes one cell's median, as smla-kbench --json
# does (100 + the timed runs so far in build a, so 101 and 103; 88 + them in b, 90 and 92);
# smla-gpu-test passes in a and fails in b. With --grid it writes three cells instead: X 100 in
# both, Y 50 in a and 60 in b (+20 %), Z 40 in a and 41 in b (+2.5 %, under the 3 %).
for b in a b; do
  mkdir -p "$tmp/$b"
  cat > "$tmp/$b/smla-kbench" <<EOF
#!/usr/bin/env bash
json=""
prev=""
for arg in "\$@"; do [ "\$prev" = --json ] && json=\$arg; prev=\$arg; done
if [ "\$1" = --grid ]; then
  y=\$([ $b = a ] && echo 50 || echo 60)
  z=\$([ $b = a ] && echo 40 || echo 41)
  printf '{"cases": [{"name": "X", "median_us": 100}, {"name": "Y", "median_us": %s}, {"name": "Z", "median_us": %s}]}\n' "\$y" "\$z" > "\$json"
  exit 0
fi
echo $b >> "$tmp/order.log"
n=\$(grep -c . "$tmp/order.log")
t=\$([ $b = a ] && echo \$((100 + n)) || echo \$((88 + n)))
printf '{"cases": [{"name": "cell X", "median_us": %s}]}\n' "\$t" > "\$json"
EOF
  printf '#!/usr/bin/env bash\necho "[  PASSED  ] 1 test."\n' > "$tmp/$b/smla-gpu-test"
  chmod +x "$tmp/$b/smla-kbench" "$tmp/$b/smla-gpu-test"
done
printf '#!/usr/bin/env bash\nexit 1\n' > "$tmp/b/smla-gpu-test"
printf '#!/usr/bin/env bash\necho "sanitizer $*" >> "%s/sanitizer.log"\n' "$tmp" > "$tmp/sanitizer"
chmod +x "$tmp/sanitizer"

GRID="$tmp/a $tmp/b" OUT="$tmp/out" SANITIZER="$tmp/sanitizer" \
  "$src_dir/scripts/kernel_ab.sh" "$tmp/a" "$tmp/b" > "$tmp/ab.log" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "kernel_ab.sh exited with $rc with a failed step, expected 1: $(cat "$tmp/ab.log")"
[ "$(tr '\n' ' ' < "$tmp/order.log")" = "a b a b " ] ||
  fail "timed runs in the order $(tr '\n' ' ' < "$tmp/order.log"), expected a b a b"
grep -q "^gpu-test-a: rc=0" "$tmp/out/steps.txt" || fail "no passing gpu-test-a step"
grep -q "^gpu-test-b: rc=1" "$tmp/out/steps.txt" || fail "gpu-test-b's failure not recorded"
for tool in racecheck memcheck; do
  [ "$(grep -c -- "--tool $tool $tmp/a/smla-gpu-test" "$tmp/sanitizer.log")" = 1 ] ||
    fail "no $tool run on build a: $(cat "$tmp/sanitizer.log")"
done
if grep -q "$tmp/b/" "$tmp/sanitizer.log"; then fail "sanitizers ran on build b"; fi
# a: 101 and 103 (midpoint 102); b: 90 and 92 (midpoint 91), -10.8 % of a's.
grep -qF "| cell X | 101.0-103.0 | 90.0-92.0 (-10.8 %) |" "$tmp/out/summary.md" ||
  fail "summary: $(cat "$tmp/out/summary.md")"
for g in a b; do
  grep -q "^grid-$g: rc=0" "$tmp/out/steps.txt" || fail "no grid-$g step: $(cat "$tmp/out/steps.txt")"
done
grep -qF "Whole grid, b against a: 3 cells, median +2.5 %, 1 more than 3 % slower:" \
  "$tmp/out/summary.md" || fail "grid summary: $(cat "$tmp/out/summary.md")"
grep -qF -- "- Y: 50.0 -> 60.0 us (+20.0 %)" "$tmp/out/summary.md" ||
  fail "grid cell Y not listed: $(cat "$tmp/out/summary.md")"
if grep -qF -- "- Z:" "$tmp/out/summary.md"; then fail "Z (+2.5 %) listed as slower"; fi

# With 10 s of budget no step fits: each is skipped and said so, and nothing runs.
rm -f "$tmp/order.log"
BUDGET_S=10 OUT="$tmp/short" SANITIZER="$tmp/sanitizer" \
  "$src_dir/scripts/kernel_ab.sh" "$tmp/a" > /dev/null 2>&1
[ ! -e "$tmp/order.log" ] || fail "a timed run started without the budget for it"
grep -q "^kbench-a-r1: skipped (" "$tmp/short/steps.txt" ||
  fail "no skipped step in $(cat "$tmp/short/steps.txt")"
echo "kernel_ab_test: ok"
