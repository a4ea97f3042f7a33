#!/usr/bin/env python3
"""The fleet demo's timeline and checks (scripts/demo --fleet).

    fleet_timeline.py WORK NODE...

WORK holds, per node N: N.log (the service's stdout), N_requests.csv (its load client's CSV),
and status.json (`cubridge fleet status --json` at the end), publish_v4.log (the halted canary
rollout). A node killed and started again is two names: NODE (until the kill) and
NODE-restarted (after it). Prints, per node, the requests answered per version per second and
the moments its module changed, then every problem found; exits 1 when there is one.

The story's rules: no request failed anywhere; every node that ran to the end took v3 from the
fleet (the desired version after two operators raced v2 and v3); after a node's swap to v3 no
request it answered came from an older version, and no thread ever saw its version go down;
v4 (wrong answers) served no request, its canary refused it and no other node saw it; the final
status shows every node live on v3 and the rollout of v4 halted.
"""
import csv
import json
import re
import sys

PROMOTION = re.compile(r"^t=\+([0-9.]+)s module kernels: version (\d+) -> (\d+) \((\w+), key \w+\)",
                       re.M)
REFUSAL = re.compile(r"^t=\+([0-9.]+)s module kernels: version (\d+) refused \(([^)]*)\)", re.M)
START = re.compile(r"start unix ([0-9.]+)")
DESIRED = 3
BROKEN = 4


def read_node(work, node, problems):
    """The node's requests and its module changes: (rows, [(unix, from, to, how)])."""
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


def check_node(node, rows, events, ran_to_end, canary, problems):
    """The per-node rules; returns when the node took the desired version (or None)."""
    ok = [r for r in rows if r["ok"]]
    failed = len(rows) - len(ok)
    if not rows: problems.append("%s: no requests were recorded" % node)
    if failed: problems.append("%s: %d requests failed" % (node, failed))
    swaps = [e for e in events if e[1] is not None and e[2] == DESIRED and e[3] == "fleet"]
    if ran_to_end and not swaps:
        problems.append("%s: its log shows no fleet promotion to version %d" % (node, DESIRED))
    if swaps:
        late = [r for r in ok if r["version"] != DESIRED and r["send"] > swaps[-1][0] + 0.005]
        if late: problems.append("%s: %d requests sent after its swap to v%d were served by v%d"
                                 % (node, len(late), DESIRED, late[0]["version"]))
    for t in sorted({r["thread"] for r in ok}):
        highest = 0
        for r in sorted((r for r in ok if r["thread"] == t), key=lambda r: r["send"]):
            if r["version"] < highest:
                problems.append("%s: thread %d served by v%d after v%d" % (node, t, r["version"], highest))
                break
            highest = r["version"]
    if any(r["version"] == BROKEN for r in ok):
        problems.append("%s: version %d served requests" % (node, BROKEN))
    broken = [e for e in events if e[2] == BROKEN]
    if any(e[1] is not None for e in broken):
        problems.append("%s: version %d was promoted" % (node, BROKEN))
    if node == canary and ran_to_end and not any(e[1] is None for e in broken):
        problems.append("%s (the canary of v%d): its log shows no refusal of it" % (node, BROKEN))
    if node != canary and broken:
        problems.append("%s: saw version %d, which only its canary may see" % (node, BROKEN))
    return swaps[-1][0] if swaps else None


def check_status(work, nodes, problems):
    """`cubridge fleet status --json` at the end: every node live on v3, v4 halted."""
    try:
        status = json.load(open(work + "/status.json"))
    except (OSError, ValueError) as e:
        problems.append("fleet status: %s" % e)
        return
    seen = {n["node"]: n for n in status.get("nodes", [])}
    for node in nodes:
        n = seen.get(node)
        if n is None: problems.append("fleet status: no %s" % node)
        elif not n.get("live"): problems.append("fleet status: %s is not live" % node)
        elif n.get("versions", {}).get("kernels") != DESIRED:
            problems.append("fleet status: %s runs kernels %s, not %d"
                            % (node, n.get("versions", {}).get("kernels"), DESIRED))
    module = [m for m in status.get("modules", []) if m.get("module") == "kernels"]
    if not module or not module[0].get("stable") or module[0]["stable"].get("version") != DESIRED:
        problems.append("fleet status: the stable desired version of kernels is not %d" % DESIRED)
    elif module[0].get("phase") != "halted" or "v%d" % BROKEN not in module[0].get("reason", ""):
        problems.append("fleet status: the rollout of kernels v%d is not shown halted" % BROKEN)


def print_timeline(nodes, data, t0):
    print("  per second: requests answered by v1/v2/v3 and failed, per node "
          "(* took v3 in that second, + took v2, x v4 refused)")
    print(("  %6s  %s" % ("", "".join("%-22s" % n for n in nodes))).rstrip())
    end = max((r["send"] for rows, _ in data.values() for r in rows), default=t0)
    for s in range(int(end - t0) + 1):
        cells = []
        for node in nodes:
            rows, events = data[node]
            sel = [r for r in rows if s <= r["send"] - t0 < s + 1]
            mark = "".join("*" if e[1] is not None and e[2] == DESIRED else
                           "+" if e[1] is not None and e[2] == 2 else
                           "x" if e[2] == BROKEN else "" for e in events if s <= e[0] - t0 < s + 1)
            cells.append("%-22s" % ("%d/%d/%d %d%s" % (
                sum(r["ok"] and r["version"] == 1 for r in sel),
                sum(r["ok"] and r["version"] == 2 for r in sel),
                sum(r["ok"] and r["version"] == DESIRED for r in sel),
                sum(not r["ok"] for r in sel), " " + mark if mark else "")))
        print("  +%3d s  %s" % (s, "".join(cells).rstrip()))


def main():
    work, names = sys.argv[1], sys.argv[2:]
    problems = []
    canary = None
    try:
        m = re.search(r"canaries of 'kernels' v%d: (\S+)" % BROKEN, open(work + "/publish_v4.log").read())
        canary = m.group(1) if m else None
    except OSError:
        pass
    if canary is None: problems.append("publish of v%d: no canary named in its output" % BROKEN)
    # A node killed mid-story has a later "-restarted" name: only that one ran to the end.
    ran_to_end = {n: (n + "-restarted") not in names for n in names}
    data = {}
    for name in names:
        rows, events = read_node(work, name, problems)
        data[name] = (rows, events)
        node = name[:-len("-restarted")] if name.endswith("-restarted") else name
        check_node(name, rows, events, ran_to_end[name], canary if node == canary else None, problems)
    sends = [r["send"] for rows, _ in data.values() for r in rows]
    t0 = min(sends) if sends else 0
    print("fleet timeline (client clocks, +s from the first request of any node):")
    for name in names:
        rows, events = data[name]
        ok = [r for r in rows if r["ok"]]
        counts = ", ".join("v%d %d" % (v, sum(r["version"] == v for r in ok))
                           for v in sorted({r["version"] for r in ok}))
        print("  %s: %d requests (%s), %d failed" % (name, len(rows), counts or "none", len(rows) - len(ok)))
        for when, frm, to, how in events:
            what = ("version %d -> %d (%s)" % (frm, to, how) if frm is not None
                    else "version %d refused (%s)" % (to, how))
            print("    +%.3f s %s" % (when - t0, what))
    nodes = sorted({n[:-len("-restarted")] if n.endswith("-restarted") else n for n in names})
    check_status(work, nodes, problems)
    print_timeline(names, data, t0)
    for p in problems: print("timeline: PROBLEM: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
