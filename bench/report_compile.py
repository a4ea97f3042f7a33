#!/usr/bin/env python3
"""Prints the compile-cache speed-ups from bench_compile's Google Benchmark JSON output.

Run bench_compile with --benchmark_repetitions=N --benchmark_out=FILE --benchmark_out_format=json;
each speed-up is median(without cache) / median(cache hit), both measured in the same run."""
import json
import sys

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}

# (label, reference benchmark, cached benchmark, minimum speed-up)
SPEEDUPS = [
    ("NVRTC compile vs compile-cache hit", "BM_compile_nvrtc", "BM_compile_cache_hit", 100.0),
    ("nvJitLink PTX link vs cache hit", "BM_link_nvjitlink", "BM_link_cache_hit", 100.0),
]


def medians(path):
    """run name -> median real time in nanoseconds (the runs themselves if no aggregates)."""
    with open(path) as f:
        data = json.load(f)
    out, runs = {}, {}
    for b in data["benchmarks"]:
        name = b["run_name"]
        ns = b["real_time"] * UNIT_NS[b["time_unit"]]
        if b.get("aggregate_name") == "median":
            out[name] = ns
        elif b.get("run_type", "iteration") == "iteration":
            runs.setdefault(name, []).append(ns)
    for name, values in runs.items():
        if name not in out:
            values.sort()
            out[name] = values[len(values) // 2]
    return data.get("context", {}), out


def show(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:10.3f} ms"
    return f"{ns / 1e3:10.3f} us"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report_compile.py bench_compile.json")
    context, m = medians(sys.argv[1])
    print(f"host: {context.get('host_name', '?')}, {context.get('num_cpus', '?')} CPUs, "
          f"{context.get('date', '?')}")
    print(f"{'benchmark':28} {'median':>13}")
    for name in sorted(m):
        print(f"{name:28} {show(m[name])}")
    print()
    print(f"{'comparison':40} {'without':>13} {'hit':>13} {'speed-up':>10}  target")
    failed = False
    for label, reference, cached, target in SPEEDUPS:
        if reference not in m or cached not in m:
            print(f"{label:40} missing ({reference} or {cached})")
            failed = True
            continue
        ratio = m[reference] / m[cached]
        met = ratio >= target
        failed |= not met
        print(f"{label:40} {show(m[reference])} {show(m[cached])} {ratio:9.0f}x  "
              f">= {target:.0f}x {'MET' if met else 'MISSED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
