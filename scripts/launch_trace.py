#!/usr/bin/env python3
"""Where a launch's device time goes, from a smla-launch-trace CSV (bench/launch_trace.cc).

Splits the trace at the executor's stream synchronisations (one per launch), keeps the last
launches whose device operations match the most common sequence, and prints, per operation, the
median gap before it (the device idle since the previous operation ended) and its median
duration, in microseconds.

Usage: scripts/launch_trace.py TRACE.csv [--launches N] [--show-one]
"""
import argparse
import csv
import statistics


def short(name):
    for key in ("copy_kernel", "check_inputs", "write_rows", "combine", "expand_query",
                "Attend", "row_union"):
        if key in name:
            return key
    return name[:40]


def launches(rows):
    """Each launch's device operations (K, M), in device order: the operations whose runtime
    calls (same correlation id) the host made between two of the executor's synchronisations."""
    launch_of, n = {}, 0
    for r in rows:
        if r["type"] != "A":
            continue
        if "StreamSynchronize" in r["name"]:
            n += 1
        else:
            launch_of[r["correlation"]] = n
    out = {}
    for r in rows:
        if r["type"] in ("K", "M") and r["correlation"] in launch_of:
            out.setdefault(launch_of[r["correlation"]], []).append(r)
    return [out[k] for k in sorted(out)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--show-one", action="store_true", help="print the last launch in full")
    args = ap.parse_args()
    rows = sorted(csv.DictReader(open(args.trace)), key=lambda r: int(r["start"]))
    all_launches = launches(rows)
    def signature(ops):
        return tuple(short(o["name"]) + o["bytes"] * (o["type"] == "M") for o in ops)
    sigs = [signature(ops) for ops in all_launches]
    common = max(set(sigs), key=sigs.count)
    picked = [ops for ops, s in zip(all_launches, sigs) if s == common][-args.launches:]
    print(f"{len(picked)} launches of {len(all_launches)} with the most common operations")
    print(f"{'operation':<28} {'bytes':>9} {'gap us':>8} {'time us':>8}")
    for i in range(len(common)):
        gaps = [(int(ops[i]["start"]) - int(ops[i - 1]["end"])) / 1e3 for ops in picked] if i else []
        times = [(int(ops[i]["end"]) - int(ops[i]["start"])) / 1e3 for ops in picked]
        op = picked[-1][i]
        name = short(op["name"]) if op["type"] == "K" else op["name"]
        gap = f"{statistics.median(gaps):8.2f}" if gaps else f"{'':>8}"
        print(f"{name:<28} {op['bytes'] if op['type'] == 'M' else '':>9} {gap} "
              f"{statistics.median(times):8.2f}")
    spans = [(int(ops[-1]["end"]) - int(ops[0]["start"])) / 1e3 for ops in picked]
    print(f"first operation's start to last one's end: median {statistics.median(spans):.2f} us")
    if args.show_one:
        t0 = int(picked[-1][0]["start"])
        for o in picked[-1]:
            print(f"{o['type']} {(int(o['start']) - t0) / 1e3:9.2f} {(int(o['end']) - t0) / 1e3:9.2f}"
                  f" {short(o['name'])}")


if __name__ == "__main__":
    main()
