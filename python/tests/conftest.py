"""Fixtures of the CPU tests: the project's test kernels built by nvcc into a temporary folder."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TEST_KERNELS = REPO / "tests" / "kernels" / "test_kernels.cu"


def _nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.access(found, os.X_OK):
        pytest.fail("nvcc not found (the CUDA toolkit is expected at /usr/local/cuda)")
    return found


def _build(out: pathlib.Path, *args: str) -> pathlib.Path:
    subprocess.run([_nvcc(), *args, "-o", str(out), str(TEST_KERNELS)], check=True)
    return out


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> dict[str, pathlib.Path]:
    """test_kernels.cu as an sm_90 cubin and as a fatbin of sm_80, sm_90 and compute_90."""
    folder = tmp_path_factory.mktemp("images")
    return {
        "cubin": _build(folder / "test_kernels.sm_90.cubin", "-cubin", "-arch=sm_90"),
        "fatbin": _build(folder / "test_kernels.fatbin", "-fatbin",
                         "-gencode", "arch=compute_80,code=sm_80",
                         "-gencode", "arch=compute_90,code=sm_90",
                         "-gencode", "arch=compute_90,code=compute_90"),
    }
