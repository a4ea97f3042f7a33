#!/usr/bin/env python3
"""Prints the GoogleTest binaries (BUILD/tests/test_*) that run at least one gpu-labelled test,
one path per line, from CTest's own test list: scripts/gpu-build keeps only these (and
test_driver), scripts/gpu-check runs compute-sanitizer over them.
    scripts/gpu_test_binaries.py BUILD"""
import json
import os
import subprocess
import sys

build = sys.argv[1]
listing = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
binaries = set()
for test in json.loads(listing)["tests"]:
    labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
    command = test.get("command") or []
    on_gpu = any(label.startswith("gpu") for label in labels)  # "gpu", "gpu-serial"
    if on_gpu and command and os.path.basename(command[0]).startswith("test_"):
        binaries.add("tests/" + os.path.basename(command[0]))
for path in sorted(binaries):
    print(path)
