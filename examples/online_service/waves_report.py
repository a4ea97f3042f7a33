#!/usr/bin/env python3
"""The report of `scripts/demo --fleet --waves`: from each node's request log (online_load_client's
CSV), the services' logs and the two `cubridge fleet publish --waves` logs, what v3 did before it
was halted, and a picture of the rollout (WORK/waves.svg: one lane per node, coloured by the
version that answered, wrong answers in red, the waves' steps as lines).

  waves_report.py WORK node-1 node-2 ...

Exit 1 when a request failed other than v3's wrong answers, or a node of a later wave ran v3.
"""
import csv
import datetime
import html
import os
import re
import sys

work, nodes = sys.argv[1], sys.argv[2:]
COLOURS = {1: "#9aa5b1", 2: "#4e79a7", 3: "#f28e2b"}
STEP = re.compile(r"^\s*(\d{4}-\d\d-\d\dT[\d:.]+)Z \(\+\s*[\d.]+ s\)\s+wave (\d+)\s+(\w+)\s+(.*)$")


def unix(text):
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc).timestamp()


def steps(name):
    out = []
    path = os.path.join(work, name)
    if os.path.exists(path):
        for line in open(path):
            m = STEP.match(line)
            if m:
                out.append((unix(m.group(1)), int(m.group(2)), m.group(3), m.group(4)))
    return out


requests = {}
for node in nodes:
    rows = []
    with open(os.path.join(work, f"{node}_requests.csv")) as f:
        for r in csv.DictReader(f):
            rows.append((float(r["send_unix"]), int(r["version"] or 0), r["ok"] == "1", r["status"]))
    requests[node] = rows

problems = []
print("waves report (client clocks; the canary of wave 1 is node-1):")
for node in nodes:
    rows = requests[node]
    wrong_v3 = sum(1 for _, v, ok, _ in rows if not ok and v == 3)
    other = sum(1 for _, v, ok, _ in rows if not ok and v != 3)
    by_version = {}
    for _, v, ok, _ in rows:
        if ok:
            by_version[v] = by_version.get(v, 0) + 1
    print(f"  {node}: {len(rows)} requests, answered right by "
          + ", ".join(f"v{v} {n}" for v, n in sorted(by_version.items()))
          + f"; wrong answers of v3 {wrong_v3}; other failures {other}")
    if other:
        problems.append(f"{node}: {other} request(s) failed other than v3's wrong answers")
    if node != nodes[0] and any(v == 3 for _, v, _, _ in rows):
        problems.append(f"{node} answered with v3, but only wave 1 ({nodes[0]}) may run it")
    log = open(os.path.join(work, f"{node}.log")).read()
    if node != nodes[0] and re.search(r"module kernels: version \d+ -> 3", log):
        problems.append(f"{node} loaded v3")

v2_steps, v3_steps = steps("publish_v2.log"), steps("publish_v3.log")
canary = requests[nodes[0]]
v3_times = [t for t, v, _, _ in canary if v == 3]
halted = [t for t, _, what, _ in v3_steps if what == "halted"]
if v3_times and halted:
    first, last = min(v3_times), max(v3_times)
    wrong = sum(1 for _, v, ok, _ in canary if not ok and v == 3)
    answered = len(v3_times)
    print(f"  v3 on {nodes[0]}: first answer at +0.000 s, halt written at +{halted[0] - first:.3f} s "
          f"(promote to halt), last v3 answer at +{last - first:.3f} s; {wrong} wrong of {answered} "
          f"answers by v3 ({100.0 * wrong / max(answered, 1):.2f}%)")
else:
    problems.append("no v3 answer on the canary, or no halt in publish_v3.log")
for label, s in (("v2", v2_steps), ("v3", v3_steps)):
    for t, wave, what, detail in s:
        print(f"  {label} wave {wave} {what}: {detail}")

# The picture.
start = min(t for rows in requests.values() for t, _, _, _ in rows)
end = max(t for rows in requests.values() for t, _, _, _ in rows)
width, lane, left, top = 1100, 46, 90, 40
scale = (width - left - 20) / max(end - start, 1e-3)
x = lambda t: left + (t - start) * scale
height = top + lane * len(nodes) + 110
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
       f'font-family="sans-serif" font-size="12">',
       f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
       f'<text x="{left}" y="22" font-size="15" font-weight="bold">cubridge fleet: v2 through '
       'three waves, v3 (wrong on 1% of requests) halted in wave 1</text>']
bucket = 0.1
for i, node in enumerate(nodes):
    y = top + i * lane
    svg.append(f'<text x="10" y="{y + 24}">{html.escape(node)}</text>')
    counts = {}
    for t, v, ok, _ in requests[node]:
        b = int((t - start) / bucket)
        counts.setdefault(b, {}).setdefault(v, 0)
        counts[b][v] += 1
    for b, per in sorted(counts.items()):
        v = max(per, key=per.get)
        svg.append(f'<rect x="{x(start + b * bucket):.1f}" y="{y + 8}" width="{bucket * scale + 0.5:.1f}" '
                   f'height="26" fill="{COLOURS.get(v, "#cccccc")}"/>')
    for t, v, ok, _ in requests[node]:
        if not ok:
            svg.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y + 4}" y2="{y + 38}" '
                       'stroke="#e5534b" stroke-width="1"/>')
base = top + lane * len(nodes)
for label, s, colour in (("v2", v2_steps, "#4e79a7"), ("v3", v3_steps, "#c0392b")):
    for n, (t, wave, what, _) in enumerate(s):
        if what not in ("started", "passed", "halted", "completed"):
            continue
        svg.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{base + 8}" stroke="{colour}" '
                   'stroke-dasharray="4 3"/>')
        svg.append(f'<text x="{x(t) + 2:.1f}" y="{base + 22 + 14 * (n % 4)}" fill="{colour}">'
                   f'{label} wave {wave} {what}</text>')
for i, (v, c) in enumerate(sorted(COLOURS.items())):
    svg.append(f'<rect x="{left + i * 110}" y="{height - 22}" width="14" height="14" fill="{c}"/>'
               f'<text x="{left + i * 110 + 20}" y="{height - 10}">v{v} answered</text>')
svg.append(f'<line x1="{left + 340}" x2="{left + 340}" y1="{height - 22}" y2="{height - 8}" '
           f'stroke="#e5534b"/><text x="{left + 348}" y="{height - 10}">a wrong answer</text>')
svg.append(f'<text x="{left + 470}" y="{height - 10}">{end - start:.1f} s of load, '
           f'{sum(len(r) for r in requests.values())} requests</text></svg>')
with open(os.path.join(work, "waves.svg"), "w") as f:
    f.write("\n".join(svg))
for p in problems:
    print(f"  PROBLEM: {p}")
sys.exit(1 if problems else 0)
