#!/usr/bin/env python3
"""Turns Google Benchmark JSON (run with --benchmark_repetitions) into the ratios of issue #2.

Each ratio is median(ours) / median(reference), both measured in the same run."""
import json
import sys


def medians(path):
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median":
            out[b["run_name"]] = (b["real_time"] if "manual_time" in b["name"] else b["cpu_time"], b["time_unit"])
    return out


RATIOS = [
    ("typed launch vs raw cuLaunchKernel (empty kernel)", "BM_launch_typed", "BM_launch_raw", 1.05),
    ("checked launch vs raw cuLaunchKernel (empty kernel)", "BM_launch_checked", "BM_launch_raw", 1.05),
    ("typed launch vs raw, 3 arguments", "BM_launch_typed_args", "BM_launch_raw_args", 1.05),
    ("checked launch vs raw, 3 arguments", "BM_launch_checked_args", "BM_launch_raw_args", 1.05),
    ("scoped_current vs raw push/pop pair", "BM_scoped_current", "BM_push_pop_raw", 1.2),
    ("copy through host vs zero-copy view, 1 MiB", "BM_copy_through_host/1048576/manual_time", "BM_share_view/1048576/manual_time", None),
    ("copy through host vs zero-copy view, 1 GiB", "BM_copy_through_host/1073741824/manual_time", "BM_share_view/1073741824/manual_time", None),
]


def main():
    m = medians(sys.argv[1])
    print(f"{'comparison':58} {'ours':>12} {'reference':>12} {'ratio':>8}  target")
    for label, ours, ref, target in RATIOS:
        if ours not in m or ref not in m:
            print(f"{label:58} missing ({ours} or {ref})")
            continue
        (a, unit), (b, _) = m[ours], m[ref]
        ratio = a / b
        verdict = "" if target is None else (f"<= {target}  {'MET' if ratio <= target else 'MISSED'}")
        print(f"{label:58} {a:10.3f}{unit:>2} {b:10.3f}{unit:>2} {ratio:8.3f}  {verdict}")


if __name__ == "__main__":
    main()
