"""Medians over repeated runs of group_swap_under_load (JSON files given by glob per mode)."""
import glob, json, statistics as st, sys
root = sys.argv[1]
for mode in ["back-to-back", "paced"]:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{root}/{mode}-*/group_swap_under_load.json"))]
    n = runs[0]["member_count"]
    print(f"== {mode}: {len(runs)} runs, {n} members ({runs[0]['members']}), medians over the runs")
    print(f"   must-be-zero checks 0 in every run: {all(r['must_be_zero_ok'] for r in runs)}")
    cycles = sum(p["cycles_done"] for r in runs for p in r["phases"] if p["phase"] == "group-swap")
    pinned = sum(p["pinned_steps"] for r in runs for p in r["phases"])
    mixed = sum(p["mixed_steps"] for r in runs for p in r["phases"])
    print(f"   {cycles} group swaps in all; {pinned} pinned steps across the members, {mixed} mixed")
    print("   member  phase        gap p99 us  gap max us  lat p99 us  launches  failed  wrong tags")
    for m in range(n):
        for ph in range(len(runs[0]["phases"])):
            rows = [r["phases"][ph]["members"][m] for r in runs]
            med = lambda f: st.median(f(x) for x in rows)
            print(f"   {m:6}  {runs[0]['phases'][ph]['phase']:11} {med(lambda x: x['gpu_gap_us']['p99']):11.1f}"
                  f" {med(lambda x: x['gpu_gap_us']['max']):11.0f} {med(lambda x: x['launch_latency_us']['p99']):11.1f}"
                  f" {med(lambda x: x['launches']):9.0f} {sum(x['failed_launches'] for x in rows):7}"
                  f" {sum(x['wrong_tags'] for x in rows):11}")
        ratios = [r["gap_ratio"][m]["group_swap_over_bare_load_max_gap"] for r in runs]
        print(f"   member {m}: group-swap max gap / bare-load max gap: median {st.median(ratios):.2f}x"
              f" (runs {min(ratios):.2f}-{max(ratios):.2f}; target <= 1.5x)")
