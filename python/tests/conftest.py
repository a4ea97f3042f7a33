"""Fixtures of the CPU tests: the project's test kernels built by nvcc into a temporary folder."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

import cubridge

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


@pytest.fixture(autouse=True)
def _state_dir(tmp_path_factory, monkeypatch):
    """The default replay state directory of an UpdateEndpoint: a fresh one per test, so that no
    test writes into the user's ~/.local/state/cubridge."""
    monkeypatch.setenv("CUBRIDGE_STATE_DIR", str(tmp_path_factory.mktemp("cubridge_state")))


@pytest.fixture(scope="session")
def torch():
    """torch, for the GPU tests that run beside it; they skip where it is not installed."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ctx(torch):
    """The device's primary context as torch makes it (current on this thread), adopted by
    cubridge: the context torch's tensors and streams live in. Adopted again for each module:
    the isolation tests reset the device in between."""
    torch.zeros(1, device="cuda")
    return cubridge.PrimaryContext.adopt_runtime()


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


# --- isolation: the sandbox's test libraries and the reset guard, built from the tree ---------
# Each can be given prebuilt through an environment variable (e.g. the CMake build's target
# file); otherwise it is compiled here with the C compiler or nvcc, or the tests skip saying why.

SANDBOX_CPU_LIBRARY = REPO / "tests" / "sandbox" / "cpu_library.c"
GUEST_LIBRARY = REPO / "tests" / "guest_lib" / "guest_lib.cu"


def _prebuilt(variable: str) -> pathlib.Path | None:
    path = os.environ.get(variable)
    if not path:
        return None
    if not os.path.isfile(path):
        pytest.fail(f"${variable} names {path}, which does not exist")
    return pathlib.Path(path)


def _c_compiler() -> str:
    found = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not found:
        pytest.skip("no C compiler (cc, gcc) to build the test library; set the variable")
    return found


def _compile_c(out: pathlib.Path, source: pathlib.Path, *flags: str) -> pathlib.Path:
    subprocess.run([_c_compiler(), "-shared", "-fPIC", "-fvisibility=hidden", "-O2",
                    f"-I{REPO / 'include'}", *flags, "-o", str(out), str(source)], check=True)
    return out


@pytest.fixture(scope="session")
def sandbox_cpu_library(tmp_path_factory) -> pathlib.Path:
    """tests/sandbox/cpu_library.c (entries echo, count_calls, crash, do_abort, hang, ...), or
    $CUBRIDGE_TEST_SANDBOX_CPU_LIB."""
    return _prebuilt("CUBRIDGE_TEST_SANDBOX_CPU_LIB") or _compile_c(
        tmp_path_factory.mktemp("sandbox") / "libcubridge_test_sandbox_cpu.so",
        SANDBOX_CPU_LIBRARY)


@pytest.fixture(scope="session")
def reset_guard_library() -> pathlib.Path:
    """The reset guard the package ships beside its extension (libcubridge_reset_guard.so, for
    LD_PRELOAD), or $CUBRIDGE_RESET_GUARD_LIB."""
    packaged = pathlib.Path(cubridge.__file__).parent / "libcubridge_reset_guard.so"
    return _prebuilt("CUBRIDGE_RESET_GUARD_LIB") or packaged


@pytest.fixture(scope="session")
def guest_library(tmp_path_factory) -> pathlib.Path:
    """tests/guest_lib/guest_lib.cu as nvcc builds a third-party library by default (static
    cudart; entries guest_init, guest_reset, guest_add_one, guest_abort, ...), or
    $CUBRIDGE_TEST_GUEST_LIB."""
    prebuilt = _prebuilt("CUBRIDGE_TEST_GUEST_LIB")
    if prebuilt:
        return prebuilt
    out = tmp_path_factory.mktemp("guest_lib") / "libcubridge_test_guest_lib.so"
    subprocess.run([_nvcc(), "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
                    "-cudart", "static", "-gencode", "arch=compute_90,code=sm_90",
                    f"-I{REPO / 'include'}", "-o", str(out), str(GUEST_LIBRARY)], check=True)
    return out


# --- the fleet: a real nats-server, and the C++ test node where the CMake build made it --------

def _nats_server_binary() -> str:
    for candidate in (os.environ.get("NATS_SERVER"), shutil.which("nats-server"),
                      "/usr/sbin/nats-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no nats-server ($NATS_SERVER, PATH, /usr/sbin): scripts/setup installs it")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nats_server(tmp_path):
    """A JetStream nats-server of its own on a free loopback port; yields its URL."""
    import time
    binary = _nats_server_binary()
    port = _free_port()
    log = tmp_path / "nats.log"
    process = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd",
                                str(tmp_path / "jetstream"), "-l", str(log)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while "Server is ready" not in (log.read_text() if log.exists() else ""):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"nats-server did not start: {log.read_text() if log.exists() else ''}")
        time.sleep(0.05)
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="session")
def fleet_node_binary() -> pathlib.Path:
    """tests/fleet/fleet_node.cpp as the CMake build made it: a fleet node over a recording sink
    (no GPU). scripts/python-test names it in $CUBRIDGE_TEST_FLEET_NODE when build/ has it."""
    path = _prebuilt("CUBRIDGE_TEST_FLEET_NODE")
    if path is None:
        pytest.skip("no $CUBRIDGE_TEST_FLEET_NODE (scripts/test builds it into "
                    "build/tests/cubridge_test_fleet_node)")
    return path
