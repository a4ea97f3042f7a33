#!/usr/bin/env python3
"""The readiness poller and the report of `scripts/demo --bad-versions`: two bad versions of
`kernels` (v3 faults on 1 request in 1,000, v4 is wrong on 1%), each pushed to one service three
ways, (a) no probation and no exit policy, (b) the exit policy (--exit-when-poisoned), (c)
probation (--probation) and the exit policy, each under a supervisor that starts the service
again when it exits with a failure.

  bad_versions_report.py poll URL OUT STOP_FILE [EVERY_S]
      GET URL every EVERY_S (0.02) seconds until STOP_FILE exists; OUT gets one CSV line per
      poll: sent_unix,answered_unix,status (0: no answer).
  bad_versions_report.py report TABLE_MD RUN_DIR...
      One row per run (a RUN_DIR of scripts/demo: run.json, requests-*.csv from
      online_load_client, service-*.log, supervisor.log, readyz.csv, push.log, push.rc), printed
      and written to TABLE_MD as a markdown table with the definitions under it.

The report's columns, from the load client's CSVs (what the clients saw) and the services' logs:
  failed        requests with no right answer other than a wrong result: a 500 "failed" (the
                CUDA work failed), no answer (the process was gone), any other status
  wrong         answers computed wrong: a 500 "wrong_result" (the service's own output check
                caught it; a service without one would have served it) or a 200 with a wrong
                result
  ready while poisoned
                from the service's "poisoned at unix T" line to the first /readyz poll after it
                that did not answer 200 (503, or no answer); to the end of the run if none
  serving again from the first failed request to the first right answer sent after the last
                failed one (from the same process or a restarted one)
  push          the answer to `cubridge push` of the bad version: promoted, or refused with the
                endpoint's reason (422 faulted_in_probation, mismatch_in_probation, ...)
Exit 0 when every (c) run served no failed request and no wrong answer and refused its version
with faulted_in_probation or mismatch_in_probation; 1 otherwise; 64 bad command line.
"""
import csv
import glob
import http.client
import json
import os
import re
import sys
import time
import urllib.parse

WAYS = {
    "a": "(a) no probation, no exit policy",
    "b": "(b) exit policy",
    "c": "(c) probation + exit policy",
}
PROBATION_REFUSALS = ("faulted_in_probation", "mismatch_in_probation")


def poll(url, out, stop, every):
    """GET `url` every `every` s until `stop` exists; a fresh connection each time (the process
    behind the port may change)."""
    parts = urllib.parse.urlsplit(url)
    with open(out, "w") as f:
        f.write("sent_unix,answered_unix,status\n")
        while not os.path.exists(stop):
            sent = time.time()
            status = 0
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=1)
            try:
                connection.request("GET", parts.path or "/")
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                status = 0
            finally:
                connection.close()
            f.write("%.6f,%.6f,%d\n" % (sent, time.time(), status))
            f.flush()
            time.sleep(max(0.0, every - (time.time() - sent)))


def read_requests(run):
    rows = []
    for path in sorted(glob.glob(os.path.join(run, "requests-*.csv"))):
        with open(path) as f:
            for r in csv.DictReader(f):
                try:
                    rows.append({"send": float(r["send_unix"]), "status": int(r["status"]),
                                 "version": int(r["version"] or 0), "ok": r["ok"] == "1",
                                 "error": r.get("error") or ""})
                except (KeyError, ValueError):
                    continue  # a line cut short
    rows.sort(key=lambda r: r["send"])
    return rows


def is_wrong(r):
    return not r["ok"] and (r["error"].startswith("wrong_result") or r["status"] == 200)


def is_failed(r):
    return not r["ok"] and not is_wrong(r)


def service_logs(run):
    def number(path):
        m = re.search(r"service-(\d+)\.log$", path)
        return int(m.group(1)) if m else 0
    return sorted(glob.glob(os.path.join(run, "service-*.log")), key=number)


def poisoned_at(run):
    """The first "poisoned at unix T" line of any of the run's processes, and its text."""
    first = None
    for path in service_logs(run):
        for line in open(path, errors="replace"):
            m = re.search(r"online_service: poisoned at unix ([0-9.]+): (.*)$", line)
            if m and (first is None or float(m.group(1)) < first[0]):
                first = (float(m.group(1)), m.group(2).strip())
    return first


def promoted_at(run, version):
    """When the first process logged the promotion to `version` (unix), or None."""
    for path in service_logs(run):
        text = open(path, errors="replace").read()
        start = re.search(r"start unix ([0-9.]+)", text)
        m = re.search(r"^t=\+([0-9.]+)s module kernels: version \d+ -> %d " % version, text, re.M)
        if start and m:
            return float(start.group(1)) + float(m.group(1))
    return None


def readyz(run):
    rows = []
    path = os.path.join(run, "readyz.csv")
    if os.path.exists(path):
        with open(path) as f:
            for r in csv.DictReader(f):
                try:
                    rows.append((float(r["sent_unix"]), float(r["answered_unix"]), int(r["status"])))
                except (KeyError, ValueError):
                    continue
    return rows


def push_answer(run):
    """(word for the table, refusal reason or None, detail line)."""
    try:
        text = open(os.path.join(run, "push.log"), errors="replace").read()
    except OSError:
        return "no push", None, "the push did not run"
    try:
        rc = open(os.path.join(run, "push.rc")).read().strip()
    except OSError:
        rc = "?"
    m = re.search(r"refused: (\d+) (\w+): ?(.*)", text)
    if m:
        return "refused %s %s" % (m.group(1), m.group(2)), m.group(2), m.group(3).strip()
    m = re.search(r"promoted '\w+' v(\d+) \(was v(\d+)\)", text)
    if m:
        return "promoted", None, m.group(0)
    lines = [line for line in text.splitlines() if line.strip()]
    return "push failed (exit %s)" % rc, None, lines[-1] if lines else "(no output)"


def supervisor(run):
    """(starts, [exit statuses])."""
    starts, statuses = 0, []
    path = os.path.join(run, "supervisor.log")
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("start "):
                starts += 1
            m = re.match(r"exit \d+ status (\d+)", line)
            if m:
                statuses.append(int(m.group(1)))
    return starts, statuses


def seconds(value):
    return "%.3f s" % value


def analyse(run):
    meta = json.load(open(os.path.join(run, "run.json")))
    rows = read_requests(run)
    end = meta.get("end_unix") or (rows[-1]["send"] if rows else 0)
    failed = [r for r in rows if is_failed(r)]
    wrong = [r for r in rows if is_wrong(r)]
    ok = [r for r in rows if r["ok"]]
    result = {"meta": meta, "requests": len(rows), "ok": len(ok), "failed": len(failed),
              "wrong": len(wrong), "notes": [], "problems": []}
    version = int(meta["version"].lstrip("v"))
    # How long the node said it was ready while it could serve nothing.
    poison = poisoned_at(run)
    result["poisoned"] = poison is not None
    if poison is None:
        result["ready_while_poisoned"] = "-"
    else:
        polls = readyz(run)
        # Polls after the load ended see the service being stopped: not the node's word.
        after = [p for p in polls if p[1] >= poison[0] and p[0] <= end and p[2] != 200]
        if after:
            result["ready_while_poisoned"] = seconds(max(0.0, after[0][0] - poison[0]))
        else:
            result["ready_while_poisoned"] = "%s (to the end)" % seconds(end - poison[0])
        if not polls:
            result["problems"].append("no /readyz poll was recorded")
        result["notes"].append("poisoned at +%.3f s: %s" % (poison[0] - meta["start_unix"], poison[1]))
        # Before /readyz, nothing told a load balancer: the node looked ready to the end.
        result["baseline_ready"] = end - poison[0]
    # How long no right answer came.
    if not failed:
        result["serving_again"] = "-"
    else:
        first, last = failed[0]["send"], failed[-1]["send"]
        back = [r for r in ok if r["send"] > last]
        if back:
            result["serving_again"] = seconds(back[0]["send"] - first)
        else:
            result["serving_again"] = "never (%s to the end)" % seconds(end - first)
        result["notes"].append("first failed request at +%.3f s: %s" %
                               (first - meta["start_unix"], failed[0]["error"][:160] or
                                "status %d" % failed[0]["status"]))
    word, reason, detail = push_answer(run)
    result["push"], result["refusal"] = word, reason
    result["notes"].append("push: %s" % detail[:300])
    promoted = promoted_at(run, version)
    if promoted is not None:
        result["notes"].append("v%d promoted at +%.3f s" % (version, promoted - meta["start_unix"]))
    starts, statuses = supervisor(run)
    result["restarts"] = "%d" % max(0, starts - 1)
    if statuses:
        result["restarts"] += " (exit %s)" % ", ".join(str(s) for s in statuses)
    if wrong:
        result["notes"].append("wrong answers from versions %s" %
                               sorted({r["version"] for r in wrong}))
    if not rows:
        result["problems"].append("no request was recorded")
    elif not ok:
        result["problems"].append("no request was answered right")
    if meta["way"] == "c":
        if failed:
            result["problems"].append("%d request(s) failed" % len(failed))
        if wrong:
            result["problems"].append("%d wrong answer(s)" % len(wrong))
        if reason not in PROBATION_REFUSALS:
            result["problems"].append("v%d was not refused by its probation (%s)" % (version, word))
    elif meta["bad"] == "FAULT_SOMETIMES" and poison is None and word == "promoted":
        result["notes"].append("v%d was promoted and never faulted within the run" % version)
    return result


def report(table_path, runs):
    results = []
    for run in runs:
        try:
            results.append(analyse(run))
        except (OSError, ValueError, KeyError) as e:
            name = os.path.basename(run.rstrip("/"))
            print("bad-versions report: %s: cannot read the run: %s" % (name, e))
            results.append({"meta": {"version": name, "way": "?", "bad": "?"},
                            "problems": ["cannot read the run: %s" % e]})
    head = ("| version | way | requests | failed | wrong answers | ready while poisoned "
            "| serving again after | push of the bad version | restarts |")
    lines = [head, "|" + "---|" * 9]
    for r in results:
        m = r["meta"]
        if "requests" not in r:
            lines.append("| %s | %s | (no data) | | | | | | |" % (m["version"], m["way"]))
            continue
        lines.append("| %s %s | %s | %d | %d | %d | %s | %s | %s | %s |" % (
            m["version"], m["bad"], WAYS.get(m["way"], m["way"]), r["requests"], r["failed"],
            r["wrong"], r["ready_while_poisoned"], r["serving_again"], r["push"], r["restarts"]))
    notes = ["", "Per run:"]
    for r in results:
        m = r["meta"]
        notes.append("- %s %s: %s" % (m["version"], WAYS.get(m["way"], m["way"]),
                                        "; ".join(r.get("notes", [])) or "-"))
        if "baseline_ready" in r and m["way"] == "a":
            notes.append("  - without /readyz (before this change) the node looked ready until "
                         "the end: %s" % seconds(r["baseline_ready"]))
        for p in r.get("problems", []):
            notes.append("  - PROBLEM: %s" % p)
    first = next((r["meta"] for r in results if "start_unix" in r["meta"]), {})
    definitions = [
        "",
        "Clients: %s threads of online_load_client, seeds 0..999 in turn (v3 faults on seed 500, "
        "v4 is wrong on 990..999); the bad version pushed at +%s s of %s s runs. Each service runs "
        "under a supervisor that starts it again when it exits with a failure (Restart=on-failure). "
        "(b) and (c): --exit-when-poisoned %s ms; (c): --probation %s --probation-sample-every %s."
        % (first.get("threads", "?"), first.get("swap_at", "?"), first.get("duration", "?"),
           first.get("exit_grace_ms", "?"), first.get("probation", "?"),
           first.get("probation_every", "?")),
        "failed: no right answer for a reason other than a wrong result (500 failed, no answer). "
        "wrong answers: computed wrong; this service's output check answers them 500 "
        "wrong_result, a service without one would serve them. ready while poisoned: from the "
        "service's poison line to the first /readyz poll (every 20 ms) not answering 200. "
        "serving again after: from the first failed request to the first right answer after the "
        "last failed one.",
    ]
    text = "\n".join(lines + notes + definitions) + "\n"
    print(text, end="")
    with open(table_path, "w") as f:
        f.write(text)
    problems = [p for r in results for p in r.get("problems", [])
                if r["meta"].get("way") == "c" or "requests" not in r]
    c_versions = {r["meta"]["version"] for r in results if r["meta"].get("way") == "c"}
    if not c_versions:
        problems.append("no (c) run")
    for p in problems:
        print("bad-versions report: PROBLEM: " + p)
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 5 and argv[1] == "poll":
        every = float(argv[5]) if len(argv) > 5 else 0.02
        poll(argv[2], argv[3], argv[4], every)
        return 0
    if len(argv) >= 4 and argv[1] == "report":
        return report(argv[2], argv[3:])
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
