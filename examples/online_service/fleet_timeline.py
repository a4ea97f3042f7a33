#!/usr/bin/env python3
"""The fleet demo's timeline and checks (scripts/demo --fleet).

    fleet_timeline.py WORK NODE...

WORK holds, per node N: N.log (the service's stdout), N_requests.csv (its load client's CSV), and
status.json (`cubridge fleet status --json` at the end), publish_v2.log and publish_v3.log.
Prints, per node, the requests answered per version per second and the moments its module
changed, then every problem found; exits 1 when there is one.
"""
import csv
import json
import re
import sys

PROMOTION = re.compile(r"^t=\+([0-9.]+)s module kernels: version (\d+) -> (\d+) \((\w+), key \w+\)",
                       re.M)
REFUSAL = re.compile(r"^t=\+([0-9.]+)s module kernels: version (\d+) refused \(([^)]*)\)", re.M)
START = re.compile(r"start unix ([0-9.]+)")


def read_node(work, node, problems):
    """The node's requests and its module changes: (rows, [(unix, text)])."""
    try:
        log = open("%s/%s.log" % (work, node)).read()
        rows = list(csv.DictReader(open("%s/%s_requests.csv" % (work, node))))
    except OSError as e:
        problems.append("%s: %s" % (node, e))
        return [], []
    for r in rows:
        r["send"] = float(r["send_unix"])
        r["version"] = int(r["version"])
        r["ok"] = r["ok"] == "1"
        r["thread"] = int(r["thread"])
    start = START.search(log)
    events = []
    if start:
        t0 = float(start.group(1))
        for m in PROMOTION.finditer(log):
            events.append((t0 + float(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)))
        for m in REFUSAL.finditer(log):
            events.append((t0 + float(m.group(1)), None, int(m.group(2)), m.group(3)))
    else:
        problems.append("%s: no 'start unix' in its log" % node)
    return rows, sorted(events, key=lambda e: e[0])


def check_node(node, rows, events, canary, problems):
    """The per-node rules: no failure, v2 from the fleet, v3 never serves, in order per thread."""
    ok = [r for r in rows if r["ok"]]
    failed = len(rows) - len(ok)
    if not rows: problems.append("%s: no requests were recorded" % node)
    if failed: problems.append("%s: %d requests failed" % (node, failed))
    swaps = [e for e in events if e[1] is not None and e[2] == 2 and e[3] == "fleet"]
    if not swaps:
        problems.append("%s: its log shows no fleet promotion to version 2" % node)
    else:
        late = [r for r in ok if r["version"] != 2 and r["send"] > swaps[0][0] + 0.005]
        if late: problems.append("%s: %d requests sent after its swap were served by version %d"
                                 % (node, len(late), late[0]["version"]))
        for t in sorted({r["thread"] for r in ok}):
            seen2 = False
            for r in sorted((r for r in ok if r["thread"] == t), key=lambda r: r["send"]):
                if r["version"] == 2: seen2 = True
                elif seen2:
                    problems.append("%s: thread %d served by version %d after version 2"
                                    % (node, t, r["version"]))
                    break
    if any(r["version"] == 3 for r in ok): problems.append("%s: version 3 served requests" % node)
    v3 = [e for e in events if e[2] == 3]
    if node == canary:
        if not any(e[1] is None for e in v3):
            problems.append("%s (the canary): its log shows no refusal of version 3" % node)
        if any(e[1] is not None for e in v3):
            problems.append("%s (the canary): version 3 was promoted" % node)
    elif v3:
        problems.append("%s: saw version 3, which only the canary may see" % node)
    return swaps[0][0] if swaps else None


def check_status(work, nodes, problems):
    """`cubridge fleet status --json` at the end: every node live on v2, v3 halted."""
    try:
        status = json.load(open(work + "/status.json"))
    except (OSError, ValueError) as e:
        problems.append("fleet status: %s" % e)
        return
    seen = {n["node"]: n for n in status.get("nodes", [])}
    for node in nodes:
        n = seen.get(node)
        if n is None: problems.append("fleet status: no %s" % node)
        elif n.get("versions", {}).get("kernels") != 2:
            problems.append("fleet status: %s runs kernels %s, not 2"
                            % (node, n.get("versions", {}).get("kernels")))
    module = [m for m in status.get("modules", []) if m.get("module") == "kernels"]
    if not module or module[0].get("desired_all") != 2:
        problems.append("fleet status: the desired version of kernels for all is not 2")
    elif not module[0].get("halted") or module[0]["halted"].get("version") != 3:
        problems.append("fleet status: the rollout of kernels v3 is not shown halted")


def print_timeline(nodes, data, t0):
    print("  per second: requests answered by v1/v2 and failed, per node "
          "(* promoted to v2 in that second, x v3 refused)")
    print(("  %6s  %s" % ("", "".join("%-20s" % n for n in nodes))).rstrip())
    end = max((r["send"] for rows, _ in data.values() for r in rows), default=t0)
    for s in range(int(end - t0) + 1):
        cells = []
        for node in nodes:
            rows, events = data[node]
            sel = [r for r in rows if s <= r["send"] - t0 < s + 1]
            mark = "".join("*" if e[1] is not None and e[2] == 2 else "x" if e[2] == 3 else ""
                           for e in events if s <= e[0] - t0 < s + 1)
            cells.append("%-20s" % ("%d/%d %d%s" % (
                sum(r["ok"] and r["version"] == 1 for r in sel),
                sum(r["ok"] and r["version"] == 2 for r in sel),
                sum(not r["ok"] for r in sel), " " + mark if mark else "")))
        print("  +%3d s  %s" % (s, "".join(cells).rstrip()))


def main():
    work, nodes = sys.argv[1], sys.argv[2:]
    problems = []
    canary = None
    try:
        m = re.search(r"canaries of 'kernels' v3: (\S+)", open(work + "/publish_v3.log").read())
        canary = m.group(1) if m else None
    except OSError:
        pass
    if canary is None: problems.append("publish of v3: no canary named in its output")
    data, swaps = {}, {}
    for node in nodes:
        rows, events = read_node(work, node, problems)
        data[node] = (rows, events)
        swaps[node] = check_node(node, rows, events, canary, problems)
    sends = [r["send"] for rows, _ in data.values() for r in rows]
    t0 = min(sends) if sends else 0
    print("fleet timeline (client clocks, +s from the first request of any node):")
    for node in nodes:
        rows, events = data[node]
        ok = [r for r in rows if r["ok"]]
        counts = ", ".join("v%d %d" % (v, sum(r["version"] == v for r in ok))
                           for v in sorted({r["version"] for r in ok}))
        print("  %s%s: %d requests (%s), %d failed" % (node, " (canary)" if node == canary else "",
              len(rows), counts or "none", len(rows) - len(ok)))
        for when, frm, to, how in events:
            what = ("version %d -> %d (%s)" % (frm, to, how) if frm is not None
                    else "version %d refused (%s)" % (to, how))
            print("    +%.3f s %s" % (when - t0, what))
    # The story is "under load": every change falls inside its node's stream of requests.
    for node in nodes:
        rows, events = data[node]
        if rows and events and events[-1][0] > max(r["send"] for r in rows):
            problems.append("%s: its last module change came after its load ended "
                            "(a longer DURATION?)" % node)
    if canary in swaps and swaps[canary] is not None:
        later = [n for n in nodes if n != canary and swaps[n] is not None and swaps[n] < swaps[canary]]
        if later: problems.append("%s took v2 before the canary %s" % (", ".join(later), canary))
    check_status(work, nodes, problems)
    print_timeline(nodes, data, t0)
    for p in problems: print("timeline: PROBLEM: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
