#!/usr/bin/env python3
"""Medians over repeated swap_under_load runs (one --json file per run).

A maximum GPU gap is one sample out of a thousand swaps: a single run's ratio swings by several
times from run to run. This prints, per serving-thread count, the median over the runs of each
phase's numbers and of the issue's two ratios, with their range, so that a target is judged on
the median of repeated runs.

    summarize_repeats.py run1.json run2.json ...
"""
import json
import statistics
import sys

PHASES = ["steady", "hot-swap", "bare-load", "bare-load+unload", "module+function+unload",
          "library+function+unload"]


def median_range(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{statistics.median(values):8.3g}  [{min(values):.3g} .. {max(values):.3g}]"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    if not runs:
        sys.exit("summarize_repeats.py: no JSON files given")
    by_threads = {}
    must_be_zero = 0
    for run in runs:
        for per_threads in run["runs"]:
            phases = {p["phase"]: p for p in per_threads["phases"]}
            by_threads.setdefault(per_threads["threads"], []).append(phases)
            for p in per_threads["phases"]:
                if p.get("gated"):
                    must_be_zero += p["must_be_zero"]["total"]
    first = runs[0]
    print(f"{len(runs)} runs of swap_under_load on {first['device']}, module loading "
          f"{first['module_loading']}, swap pause {first['config']['swap_pause_us']} us; "
          f"median [min .. max] over the runs")
    print(f"must-be-zero counts, summed over every gated phase of every run: {must_be_zero}")
    for threads, samples in sorted(by_threads.items()):
        print(f"\n== {threads} serving thread(s), {len(samples)} runs")
        print(f"{'phase':18} {'GPU gap max us':>32} {'GPU gap p99 us':>32} {'latency p99 us':>32}")
        for name in PHASES:
            rows = [s[name] for s in samples if name in s]
            if not rows:
                continue
            print(f"{name:18} {median_range([r['gpu_gap_us']['max'] for r in rows]):>32} "
                  f"{median_range([r['gpu_gap_us']['p99'] for r in rows]):>32} "
                  f"{median_range([r['launch_latency_us']['p99'] for r in rows]):>32}")
        stage = [s["hot-swap"]["ops"]["stage"]["us"] for s in samples if "hot-swap" in s]
        print(f"{'stage us p50':18} {median_range([x['p50'] for x in stage]):>32}   "
              f"p99 {median_range([x['p99'] for x in stage])}")

        def ratios(top, top_key, bottom, bottom_key):
            out = []
            for s in samples:
                if top in s and bottom in s:
                    out.append(ratio(s[top][top_key[0]][top_key[1]],
                                     s[bottom][bottom_key[0]][bottom_key[1]]))
            return out

        gap = ("gpu_gap_us", "max")
        lat = ("launch_latency_us", "p99")
        print("ratios (target <= 1.5):")
        print(f"  max GPU gap, hot-swap / bare load          {median_range(ratios('hot-swap', gap, 'bare-load', gap))}")
        print(f"  p99 launch latency, hot-swap / steady      {median_range(ratios('hot-swap', lat, 'steady', lat))}")
        print("references (what the driver alone costs for a swap's load and unload):")
        print(f"  max GPU gap, hot-swap / bare load+unload   {median_range(ratios('hot-swap', gap, 'bare-load+unload', gap))}")
        print(f"  p99 latency, hot-swap / bare load+unload   {median_range(ratios('hot-swap', lat, 'bare-load+unload', lat))}")
        print(f"  p99 latency, bare load / steady            {median_range(ratios('bare-load', lat, 'steady', lat))}")
        if any("module+function+unload" in s for s in samples):
            fn = "module+function+unload"
            lib = "library+function+unload"
            print("the same driver work as a swap (the served kernel loaded too), module vs CUlibrary:")
            print(f"  max GPU gap, hot-swap / module+function+unload       {median_range(ratios('hot-swap', gap, fn, gap))}")
            print(f"  p99 latency, hot-swap / module+function+unload       {median_range(ratios('hot-swap', lat, fn, lat))}")
            print(f"  max GPU gap, library / module (+function+unload)     {median_range(ratios(lib, gap, fn, gap))}")
            print(f"  p99 latency, library / module (+function+unload)     {median_range(ratios(lib, lat, fn, lat))}")


if __name__ == "__main__":
    main(sys.argv[1:])
