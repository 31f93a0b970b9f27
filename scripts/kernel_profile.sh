#!/usr/bin/env bash
# Profiles the attention kernel of one smla-kbench cell with Nsight Compute on the GPU machine
# and summarises it (scripts/ncu_summary.py): instruction mix, stall reasons, loop bodies.
# Usage: scripts/kernel_profile.sh OUT_DIR [smla-kbench cell arguments...]
#   default cell: dsv4.1-flash fp8_dsv4 TP4 decode C=32 128K (the first bar cell of issue 4).
# SMLA_KBENCH names the binary (default build-gpu/bench/smla-kbench; on the lent H200 the
# device-bundle's bin/smla-kbench with LD_LIBRARY_PATH set to its lib/). KERNEL is the ncu
# kernel-name regex (default: the direct kernel). Writes OUT_DIR/{cell.log,ncu.log,details.txt,
# source.csv.gz,summary.txt,profile.ncu-rep}.
set -euo pipefail

out=${1:?usage: scripts/kernel_profile.sh OUT_DIR [smla-kbench cell arguments...]}
shift
kbench=${SMLA_KBENCH:-build-gpu/bench/smla-kbench}
kernel=${KERNEL:-SparseMlaAttendDirectKernel}
if [ $# -eq 0 ]; then
  set -- --model dsv4.1-flash --format fp8_dsv4 --tp 4 --shape 'decode C=32' --context 128K
fi
export PATH=$PATH:/usr/local/cuda/bin
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

echo "kernel_profile: timing the cell (${*})"
"$kbench" "$@" --iters 20 --nogemm > "$out/cell.log" 2>&1
grep -E "programs=|bar:" "$out/cell.log" || true

echo "kernel_profile: ncu on one launch of /$kernel/ after 3 warm-up launches"
ncu --clock-control none -k "regex:$kernel" -s 3 -c 1 --set full --import-source no \
    -f -o "$out/profile" "$kbench" "$@" --iters 20 --nogemm > "$out/ncu.log" 2>&1
ncu -i "$out/profile.ncu-rep" --page details > "$out/details.txt"
ncu -i "$out/profile.ncu-rep" --page source --csv --print-source sass | gzip > "$out/source.csv.gz"

# programs x 8 warps x tiles, from smla-kbench's plan line (256-thread programs).
per=$(sed -nE 's/.* tiles=([0-9]+) programs=([0-9]+).*/\1 \2/p' "$out/cell.log" | head -n 1 |
      awk '{ print $1 * $2 * 8 }')
{
  grep -E "Duration|Executed Ipc Active|Registers Per Thread|Achieved Active Warps|Eligible Warps|Dynamic Shared Memory Per Block" \
      "$out/details.txt" | head -n 8
  python3 "$here/ncu_summary.py" "$out/source.csv.gz" --per "${per:-0}"
} > "$out/summary.txt"
cat "$out/summary.txt"
