#!/usr/bin/env python3
"""The Grafana dashboard (docs/grafana/cubridge-fleet.json) parses, and every metric its queries
name is one the nodes export (src/update/metrics_text.cpp writes the family names)."""
import json
import re
import sys

dashboard, writer = sys.argv[1], sys.argv[2]
with open(dashboard) as f:
    board = json.load(f)
exported = set(re.findall(r'"(cubridge_module_[a-z_]+)"', open(writer).read()))
named = set()
for panel in board["panels"]:
    for target in panel["targets"]:
        named |= set(re.findall(r"cubridge_[a-z_]+", target["expr"]))
missing = named - exported
if not named or missing:
    print(f"queries name metrics no node exports: {sorted(missing)}" if named else "no queries")
    sys.exit(1)
print(f"{len(board['panels'])} panels over {sorted(named)}")
