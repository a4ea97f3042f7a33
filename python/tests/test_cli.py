"""python -m cubridge doctor | inspect: the C++ tool's reports and exit codes; every other
subcommand handed to the C++ tool (here a fake one) or refused in one line without it."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import cubridge


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cubridge", *args], capture_output=True,
                          text=True, check=False, env=env)


def fake_tool(folder: pathlib.Path, body: str = 'printf "%s\\n" "$@"\nexit 3\n') -> pathlib.Path:
    """A stand-in for the C++ tool: a shell script `cubridge` that prints its arguments, one a
    line, and exits 3."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "cubridge"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)
    return tool


def environment(path: list[pathlib.Path], tool: pathlib.Path | None = None) -> dict[str, str]:
    """This environment with PATH of `path` alone and CUBRIDGE_TOOL set to `tool` or unset."""
    env = {k: v for k, v in os.environ.items() if k != "CUBRIDGE_TOOL"}
    env["PATH"] = os.pathsep.join(str(p) for p in path)
    if tool is not None:
        env["CUBRIDGE_TOOL"] = str(tool)
    return env


def test_doctor_exit_code_follows_the_driver():
    result = run("doctor")
    assert "driver " in result.stdout and "runtime " in result.stdout
    if cubridge.driver_available():
        assert result.returncode == 0
    else:
        assert result.returncode == 69
        assert "UNAVAILABLE" in result.stdout
        assert "libcuda.so.1" in result.stderr


def test_doctor_json():
    result = run("doctor", "--json")
    assert json.loads(result.stdout)["driver"]["available"] == cubridge.driver_available()


def test_inspect_prints_kernels(images):
    result = run("inspect", str(images["cubin"]))
    assert result.returncode == 0, result.stderr
    assert ": cubin" in result.stdout
    assert "kernel  mixed_parameters(8 B, 4 B, 1 B, 8 B, 24 B)" in result.stdout


def test_inspect_json(images):
    result = run("inspect", "--json", str(images["fatbin"]))
    assert result.returncode == 0
    assert json.loads(result.stdout)["kind"] == "fatbin"


def test_inspect_failures(tmp_path):
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(b"garbage")
    result = run("inspect", str(bad))
    assert result.returncode == 1 and "CUBRIDGE_BAD_IMAGE" in result.stderr
    assert run("inspect", str(tmp_path / "absent")).returncode == 1


def _python_script(folder: pathlib.Path) -> pathlib.Path:
    """A console script of Python named cubridge (this package's, another environment's): it
    would hand the command back, so it is passed over."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "cubridge"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(99)\n")
    script.chmod(0o755)
    return script


def test_other_subcommands_run_the_cpp_tool_found_on_path(tmp_path):
    tool = fake_tool(tmp_path / "tool")
    _python_script(tmp_path / "venv")
    args = ["sign", "--key", "a key.key", "--version", "3", "k.cubin"]
    result = run(*args, env=environment([tmp_path / "empty", tmp_path / "venv", tool.parent]))
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == args
    assert result.stderr == ""


def test_cubridge_tool_names_the_cpp_tool(tmp_path):
    on_path = fake_tool(tmp_path / "on_path", "echo on path\n")
    named = fake_tool(tmp_path / "named")
    result = run("fleet", "status", "--json", env=environment([on_path.parent], tool=named))
    assert (result.returncode, result.stdout.splitlines()) == (3, ["fleet", "status", "--json"])


def test_the_cpp_tools_exit_and_signal_pass_through(tmp_path):
    # exec, not a child: what the tool's caller sees is the tool's own end.
    tool = fake_tool(tmp_path / "tool", "kill -TERM $$\n")
    result = run("push", env=environment([tool.parent]))
    assert result.returncode == -signal.SIGTERM


def test_without_the_cpp_tool_an_unknown_subcommand_is_one_line_and_64(tmp_path):
    _python_script(tmp_path / "venv")  # passed over: no C++ tool here
    result = run("frobnicate", "--flag", env=environment([tmp_path / "venv"]))
    assert result.returncode == 64
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "'frobnicate'" in lines[0] and "C++ cubridge tool" in lines[0]
    assert "not installed" in lines[0] and "scripts/build" in lines[0]


def test_cubridge_tool_naming_a_python_script_is_refused(tmp_path):
    script = _python_script(tmp_path / "venv")
    result = run("sign", env=environment([], tool=script))
    assert result.returncode == 64
    assert "is a Python script" in result.stderr and len(result.stderr.splitlines()) == 1


def test_help_says_where_other_subcommands_go(tmp_path):
    tool = fake_tool(tmp_path / "tool")
    with_tool = run("--help", env=environment([tool.parent]))
    assert with_tool.returncode == 0
    assert "Any other subcommand" in with_tool.stdout
    assert str(tool) in "".join(with_tool.stdout.split())  # argparse may wrap it at a '-'
    without = run("--help", env=environment([]))
    assert "not installed" in without.stdout


def test_own_subcommands_stay_here_with_a_tool_installed(tmp_path, images):
    tool = fake_tool(tmp_path / "tool")
    result = run("inspect", str(images["cubin"]), env=environment([tool.parent]))
    assert result.returncode == 0 and ": cubin" in result.stdout


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"cubridge {cubridge.__version__}"


def test_the_console_script_is_python_m_cubridge():
    # Declared in the metadata, whatever the install; run where the install put a script
    # (beside this Python in a virtual environment; a `pip install --target DIR` puts it in
    # DIR/bin, which its user puts on PATH).
    import importlib.metadata
    import shutil
    scripts = [e for e in importlib.metadata.entry_points(group="console_scripts")
               if e.name == "cubridge"]
    assert [e.value for e in scripts] == ["cubridge.__main__:main"]
    script = (shutil.which("cubridge", path=str(pathlib.Path(sys.executable).parent)) or
              shutil.which("cubridge"))
    if script is None:
        pytest.skip("no cubridge script beside this Python or on PATH (pip install --target)")
    result = subprocess.run([script, "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert result.stdout.strip() == f"cubridge {cubridge.__version__}"
