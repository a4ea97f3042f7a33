"""cubridge.health() and the exit policy, without a GPU: a fresh process is healthy, and the
policy refuses what could not be told apart from a clean stop or is no exit status."""

import subprocess
import sys

import pytest

import cubridge


def test_the_names_are_exported():
    for name in ("health", "exit_when_poisoned", "POISONED_EXIT_CODE"):
        assert name in cubridge.__all__ and hasattr(cubridge, name)
    assert cubridge.POISONED_EXIT_CODE == 75


def test_a_fresh_process_is_healthy():
    # In a process of its own: no other test's CUDA work can have poisoned it.
    code = "import cubridge; print(cubridge.health() is None)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


@pytest.mark.parametrize("exit_code", [0, 256, -1])
def test_exit_codes_outside_1_to_255_are_refused(exit_code):
    with pytest.raises(cubridge.PreconditionError, match="exit code"):
        cubridge.exit_when_poisoned(grace_s=1.0, exit_code=exit_code)


@pytest.mark.parametrize("grace_s", [-0.5, float("nan"), float("inf")])
def test_a_grace_that_is_no_duration_is_refused(grace_s):
    with pytest.raises(cubridge.PreconditionError, match="grace"):
        cubridge.exit_when_poisoned(grace_s=grace_s)


def test_a_healthy_process_with_the_policy_keeps_running():
    # In a child, so that the policy is not left installed in the test process.
    code = ("import cubridge; cubridge.exit_when_poisoned(grace_s=0.0); "
            "print(cubridge.health() is None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
