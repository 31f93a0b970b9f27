#!/usr/bin/env python3
"""Summarises an Nsight Compute source page (SASS) of one kernel launch.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (scripts/kernel_profile.sh
writes it). Prints the instruction mix by opcode, the stall reasons of the sampled warps, and the
instructions grouped by how often each one ran, so that loop bodies stand out. With --per N
(programs x warps x tiles, as smla-kbench prints them) counts are also given per warp-tile.
"""
import argparse
import collections
import csv
import gzip
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # The first line names the kernel; the second is the header.
    for i, row in enumerate(rows):
        if "Source" in row and "Instructions Executed" in row:
            return rows[i], rows[i + 1:]
    sys.exit(f"{path}: no header with 'Source' and 'Instructions Executed'")


def opcode(source):
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="source page CSV (optionally .gz)")
    ap.add_argument("--per", type=float, default=0.0, help="warp-tiles to divide counts by")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    header, data = read_rows(args.csv)
    col = {name: i for i, name in enumerate(header)}
    stall_cols = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]

    def value(row, name):
        i = col[name]
        return int(row[i]) if i < len(row) and row[i] else 0

    executed = collections.Counter()
    stalls = collections.Counter()
    by_count = collections.defaultdict(int)
    body = collections.Counter()
    for row in data:
        if len(row) <= col["Instructions Executed"]:
            continue
        n = value(row, "Instructions Executed")
        executed[opcode(row[col["Source"]])] += n
        by_count[n] += 1
        body[n] += n
        for name in stall_cols:
            stalls[name] += value(row, name)

    total = sum(executed.values())
    per = args.per if args.per > 0 else None
    print(f"executed instructions: {total}" + (f" ({total / per:.0f} per warp-tile)" if per else ""))
    print("\nopcode        executed   share" + ("  per warp-tile" if per else ""))
    for op, n in executed.most_common(args.top):
        line = f"{op:10s} {n:11d}  {100 * n / total:5.1f} %"
        print(line + (f"  {n / per:8.1f}" if per else ""))

    sampled = sum(stalls.values())
    if sampled:
        print(f"\nwarp state of {sampled} samples")
        for name, n in stalls.most_common():
            if n:
                print(f"{name[len('stall_'):]:20s} {100 * n / sampled:5.1f} %")

    print("\nruns per instruction, instructions with that count, share of all executed")
    for n, weight in sorted(body.items(), key=lambda kv: -kv[1])[:10]:
        if n:
            print(f"{n:10d} {by_count[n]:6d}  {100 * weight / total:5.1f} %")


if __name__ == "__main__":
    main()
