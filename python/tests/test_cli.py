"""python -m cubridge doctor | inspect: the C++ tool's reports and exit codes."""

import json
import pathlib
import subprocess
import sys

import pytest

import cubridge


def run(*args):
    return subprocess.run([sys.executable, "-m", "cubridge", *args], capture_output=True,
                          text=True, check=False)


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
    assert run("frobnicate").returncode == 64


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
