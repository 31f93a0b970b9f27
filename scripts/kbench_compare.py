#!/usr/bin/env python3
"""Summarises the rounds of scripts/kernel_ab.sh as a markdown table.

Usage: kbench_compare.py DIR LABEL...

Reads DIR/kbench-LABEL-rN.json (smla-kbench --json) for every round N and prints, per cell, each
build's range of median times over the rounds (us), and for the builds after the first the
change of the midpoint against the first's. A build or round without its file shows '-'.

Where DIR/grid-LABEL.json (smla-kbench --grid --json) exists for the first build and a later
one, it then compares their whole grids: the median change over the cells both ran, and every
cell more than SLOWER_PCT slower (one run each, so a lone cell past it is a reason to rerun it,
not yet a verdict).
"""

import glob
import json
import os
import re
import sys


def read_medians(path):
    """Cell name -> median us of one smla-kbench --json file, or None (said on stderr)."""
    try:
        with open(path, encoding="utf-8") as f:
            return {c["name"]: float(c["median_us"]) for c in json.load(f)["cases"]}
    except (OSError, ValueError, KeyError) as e:
        print(f"kbench_compare: {path}: {e}", file=sys.stderr)
        return None


def load_rounds(directory, label):
    """Cell name -> the medians of that cell over the build's rounds."""
    times = {}
    pattern = os.path.join(directory, f"kbench-{glob.escape(label)}-r*.json")
    for path in sorted(glob.glob(pattern)):
        if not re.search(r"-r\d+\.json$", path):
            continue
        for name, median in (read_medians(path) or {}).items():
            times.setdefault(name, []).append(median)
    return times


SLOWER_PCT = 3.0  # issue 21's bar: no grid cell more than 3 % slower


def load_grid(directory, label):
    """Cell name -> its median time in DIR/grid-LABEL.json, or None without the file."""
    path = os.path.join(directory, f"grid-{label}.json")
    return read_medians(path) if os.path.exists(path) else None


def print_grids(directory, labels):
    reference = load_grid(directory, labels[0])
    if reference is None:
        return
    for label in labels[1:]:
        grid = load_grid(directory, label)
        if grid is None:
            continue
        changes = sorted(
            (100.0 * (grid[n] / reference[n] - 1.0), n) for n in grid if reference.get(n)
        )
        if not changes:
            continue
        median = changes[len(changes) // 2][0]
        slower = [(c, n) for c, n in changes if c > SLOWER_PCT]
        print(f"\nWhole grid, {label} against {labels[0]}: {len(changes)} cells, median "
              f"{median:+.1f} %, {len(slower)} more than {SLOWER_PCT:g} % slower"
              f"{':' if slower else '.'}")
        for change, name in reversed(slower):
            print(f"- {name}: {reference[name]:,.1f} -> {grid[name]:,.1f} us ({change:+.1f} %)")


def midpoint(values):
    return (min(values) + max(values)) / 2


def cell_text(values, reference):
    if not values:
        return "-"
    lo, hi = f"{min(values):,.1f}", f"{max(values):,.1f}"
    text = lo if lo == hi else f"{lo}-{hi}"
    if reference:
        change = 100.0 * (midpoint(values) / midpoint(reference) - 1.0)
        text += f" ({change:+.1f} %)"
    return text


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    directory, labels = argv[1], argv[2:]
    builds = [load_rounds(directory, label) for label in labels]
    cells = []
    for times in builds:
        cells += [name for name in times if name not in cells]
    if not cells:
        print("kbench_compare: no timed cells in", directory, file=sys.stderr)
        return 1
    print("| cell (us) | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for name in cells:
        reference = builds[0].get(name, [])
        row = [cell_text(builds[0].get(name, []), None)]
        row += [cell_text(times.get(name, []), reference) for times in builds[1:]]
        print(f"| {name} | " + " | ".join(row) + " |")
    print_grids(directory, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
