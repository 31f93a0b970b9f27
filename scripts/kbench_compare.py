#!/usr/bin/env python3
"""Summarises the rounds of scripts/kernel_ab.sh as a markdown table.

Usage: kbench_compare.py DIR LABEL...

Reads DIR/kbench-LABEL-rN.json (smla-kbench --json) for every round N and prints, per cell, each
build's range of median times over the rounds (us), and for the builds after the first the
change of the midpoint against the first's. A build or round without its file shows '-'.
"""

import glob
import json
import os
import re
import sys


def load_rounds(directory, label):
    """Cell name -> the medians of that cell over the build's rounds."""
    times = {}
    pattern = os.path.join(directory, f"kbench-{glob.escape(label)}-r*.json")
    for path in sorted(glob.glob(pattern)):
        if not re.search(r"-r\d+\.json$", path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                cases = json.load(f)["cases"]
        except (OSError, ValueError, KeyError) as e:
            print(f"kbench_compare: {path}: {e}", file=sys.stderr)
            continue
        for case in cases:
            times.setdefault(case["name"], []).append(float(case["median_us"]))
    return times


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
