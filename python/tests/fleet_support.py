"""What the fleet tests (test_fleet.py without a GPU, test_fleet_gpu.py with one) share: waiting
for what the bus makes true in its own time, and a node's secret key written as nodes require."""

from __future__ import annotations

import pathlib
import time

import pytest

import cubridge


def eventually(condition, timeout: float = 20.0, what: str = "the condition") -> None:
    """Returns once condition() holds; fails the test, naming `what`, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {timeout} s")
        time.sleep(0.05)


def write_secret(path: pathlib.Path, key: cubridge.SecretKey) -> pathlib.Path:
    """`key` written to `path` readable by its owner alone (an agent refuses a key others read)."""
    path.write_text(key.to_text())
    path.chmod(0o600)
    return path
