"""Guest contexts, shared memory and the sandbox from Python.

Without a GPU: the classes and their errors, the sandbox's worker with a library that needs no
CUDA (tests/sandbox/cpu_library.c: crash, abort, hang, exit are detected and the worker
restarted). With a GPU (needs_driver): a library call inside a guest context beside torch, the
sandbox running a CUDA library on SharedMemory that torch reads, and, each in a process of its
own, what a library's cudaDeviceReset does to torch with a guest context and with the reset
guard (tools/reset_guard) preloaded.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest

import cubridge

needs_driver = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")
no_driver = pytest.mark.skipif(cubridge.driver_available(), reason="a CUDA driver is present")


# --- without a GPU ------------------------------------------------------------------------------

def test_the_classes_and_errors_are_exported():
    for name in ("GuestContext", "SharedMemory", "Sandbox", "GuestError", "SandboxError"):
        assert name in cubridge.__all__ and hasattr(cubridge, name)
    assert issubclass(cubridge.GuestError, cubridge.Error)
    assert issubclass(cubridge.SandboxError, cubridge.Error)


def test_the_classes_document_their_members():
    for cls in (cubridge.GuestContext, cubridge.SharedMemory, cubridge.Sandbox):
        for name, member in vars(cls).items():
            if not name.startswith("_") or name in ("__enter__", "__exit__"):
                assert inspect.getdoc(member), f"{cls.__name__}.{name} has no docstring"


def test_guest_error_carries_its_findings_and_the_guest():
    e = cubridge.GuestError("guest 'fft' broke the host's state", guest="fft",
                            findings=[("primary_context_reset", "primary context X was reset"),
                                      ("host_buffer_lost", "host buffer 'input' is gone")],
                            name="CUBRIDGE_GUEST_DAMAGE", layer="isolation", code=1)
    assert e.guest == "fft" and e.layer == "isolation"
    assert e.broke("primary_context_reset") and e.broke("host_buffer_lost")
    assert not e.broke("sticky_error")
    assert e.findings[1] == ("host_buffer_lost", "host buffer 'input' is gone")


def test_a_sandbox_that_cannot_start_raises_sandbox_error_with_the_cpp_fields(tmp_path):
    with pytest.raises(cubridge.SandboxError) as caught:
        cubridge.Sandbox(tmp_path / "libmissing.so", initialize_cuda=False)
    e = caught.value
    assert e.reason == "start_failed" and e.restarted is False and e.restart_ms == 0.0
    assert e.name == "CUBRIDGE_SANDBOX_FAILURE" and e.layer == "isolation" and e.code == 2
    assert e.call == "sandbox::start"
    assert "libmissing.so does not exist" in str(e)


def test_sandbox_options_are_checked_before_a_worker_starts(tmp_path):
    library = tmp_path / "libnothing.so"
    with pytest.raises(cubridge.PreconditionError, match="no option 'timeout'.*call_timeout_ms"):
        cubridge.Sandbox(library, timeout=5)
    with pytest.raises(cubridge.PreconditionError, match="'call_timeout_ms' must be an int"):
        cubridge.Sandbox(library, call_timeout_ms="5s")
    with pytest.raises(cubridge.PreconditionError, match="'start_timeout_ms' must be > 0"):
        cubridge.Sandbox(library, start_timeout_ms=0)


def test_a_worker_that_is_not_executable_is_named(tmp_path, sandbox_cpu_library):
    with pytest.raises(cubridge.SandboxError) as caught:
        cubridge.Sandbox(sandbox_cpu_library, worker=tmp_path / "no-worker",
                         initialize_cuda=False)
    assert caught.value.reason == "start_failed"
    assert "no-worker is not an executable file" in str(caught.value)


@pytest.fixture
def cpu_box(sandbox_cpu_library):
    with cubridge.Sandbox(sandbox_cpu_library, initialize_cuda=False,
                          call_timeout_ms=10000) as box:
        yield box


def test_the_sandbox_calls_entries_in_a_worker_process(cpu_box):
    assert cpu_box.name == "libcubridge_test_sandbox_cpu.so"
    assert cpu_box.worker_pid > 0 and cpu_box.worker_pid != os.getpid()
    assert cpu_box.last_start_ms > 0 and cpu_box.restarts == 0
    assert cpu_box.call("echo", b"hello worker") == (12, b"hello worker")
    assert cpu_box.call("echo", bytearray(b"abc"), reply_capacity=2) == (3, b"ab")
    assert cpu_box.call("count_calls") == (1, b"")
    assert cpu_box.call("count_calls")[0] == 2


@pytest.mark.parametrize("entry, reason", [("crash", "crashed"), ("do_abort", "aborted"),
                                           ("exit_early", "crashed")])
def test_a_failing_entry_raises_and_a_fresh_worker_serves_the_next_call(cpu_box, entry, reason):
    assert cpu_box.call("count_calls")[0] == 1
    before = cpu_box.worker_pid
    with pytest.raises(cubridge.SandboxError) as caught:
        cpu_box.call(entry)
    e = caught.value
    assert e.reason == reason and e.restarted is True and e.restart_ms > 0
    assert f"'{entry}'" in str(e)
    assert cpu_box.worker_pid not in (0, before) and cpu_box.restarts == 1
    assert cpu_box.call("count_calls")[0] == 1, "a fresh worker counts from 1"


def test_a_call_past_its_timeout_kills_the_worker(cpu_box):
    with pytest.raises(cubridge.SandboxError) as caught:
        cpu_box.call("hang", timeout_ms=200)
    assert caught.value.reason == "timed_out" and caught.value.restarted
    assert "did not return within 200 ms" in str(caught.value)
    assert cpu_box.call("echo", b"back") == (4, b"back")


def test_an_unknown_entry_leaves_the_worker_running(cpu_box):
    pid = cpu_box.worker_pid
    with pytest.raises(cubridge.SandboxError) as caught:
        cpu_box.call("no_such_function")
    assert caught.value.reason == "no_such_entry" and caught.value.restarted is False
    assert cpu_box.worker_pid == pid


def test_an_oversized_call_is_refused_and_the_worker_kept(cpu_box):
    pid = cpu_box.worker_pid
    with pytest.raises(cubridge.PreconditionError, match="asks room for a reply of"):
        cpu_box.call("echo", b"x", reply_capacity=10**12)
    with pytest.raises(cubridge.PreconditionError, match="bytes of entry name and request"):
        cpu_box.call("echo", bytes(64 << 20))
    assert cpu_box.worker_pid == pid and cpu_box.stats["failures"] == 0
    assert cpu_box.call("echo", b"ok") == (2, b"ok")


def test_restart_and_close(cpu_box):
    pid = cpu_box.worker_pid
    cpu_box.restart()
    assert cpu_box.worker_pid != pid and cpu_box.restarts == 1
    cpu_box.close()
    cpu_box.close()
    assert cpu_box.closed
    with pytest.raises(cubridge.PreconditionError, match="the Sandbox is closed"):
        cpu_box.call("echo")


def test_a_ready_spare_takes_over_at_once_and_a_pool_serves(sandbox_cpu_library):
    with cubridge.Sandbox(sandbox_cpu_library, initialize_cuda=False, workers=2, standby=1,
                          environment={"CUBRIDGE_TEST_MARK": "spare"}) as box:
        assert box.wait_for_standby(30)
        stats = box.stats
        assert (stats["workers"], stats["spares_ready"], stats["failovers"]) == (2, 1, 0)
        spare = stats["spare_pids"][0]
        with pytest.raises(cubridge.SandboxError) as caught:
            box.call("crash")
        assert caught.value.reason == "crashed"
        assert caught.value.recovery == "spare_promoted"
        stats = box.stats
        assert spare in stats["worker_pids"] and stats["failovers"] == 1
        assert box.call("echo", b"ok") == (2, b"ok")
        assert box.wait_for_standby(30) and box.stats["spares_ready"] == 1


def test_without_a_spare_the_failing_call_waits_for_a_fresh_worker(sandbox_cpu_library):
    with cubridge.Sandbox(sandbox_cpu_library, initialize_cuda=False, standby=0) as box:
        assert box.stats["spares_ready"] == 0
        with pytest.raises(cubridge.SandboxError) as caught:
            box.call("do_abort")
        assert caught.value.recovery == "restarted" and caught.value.restart_ms > 0
        assert box.call("echo", b"ok") == (2, b"ok")


@pytest.mark.parametrize("options, message", [
    ({"mps": "sometimes"}, "'mps' must be 'allow', 'warn' or 'refuse'"),
    ({"workers": 0}, "at least one worker"),
    ({"environment": ["A=1"]}, "option 'environment' must be a dict of str to str"),
])
def test_pool_and_environment_options_are_checked(sandbox_cpu_library, options, message):
    with pytest.raises(cubridge.PreconditionError, match=message):
        cubridge.Sandbox(sandbox_cpu_library, initialize_cuda=False, **options)


class CudaArrayInterfaceOnly:
    """What a torch or CuPy tensor looks like to the sandbox: device memory, not exportable."""

    __cuda_array_interface__ = {"data": (0x7f0000000000, False), "shape": (256,),
                                "typestr": "|u1", "version": 3}


def test_buffers_that_are_not_shared_memory_are_refused_saying_what_to_use(cpu_box):
    with pytest.raises(cubridge.PreconditionError) as caught:
        cpu_box.call("echo", buffers=[CudaArrayInterfaceOnly()])
    text = str(caught.value)
    assert "buffer 0 is a" in text and "CudaArrayInterfaceOnly" in text
    assert "cannot be exported" in text and "cubridge.SharedMemory(nbytes)" in text
    with pytest.raises(cubridge.PreconditionError,
                       match="buffer 0 is of type int: pass cubridge.SharedMemory objects"):
        cpu_box.call("echo", buffers=(3,))
    with pytest.raises(cubridge.PreconditionError, match="must be bytes-like"):
        cpu_box.call("echo", "text")
    assert cpu_box.call("echo", b"ok") == (2, b"ok"), "nothing was sent"


@no_driver
def test_guest_contexts_and_shared_memory_need_a_driver():
    with pytest.raises(cubridge.DriverUnavailable):
        cubridge.GuestContext()
    with pytest.raises(cubridge.DriverUnavailable):
        cubridge.SharedMemory(4096)


def test_the_mps_policy_of_a_guest_context_is_checked_by_name():
    with pytest.raises(cubridge.PreconditionError,
                       match="GuestContext option 'mps' must be 'allow', 'warn' or 'refuse'"):
        cubridge.GuestContext(mps="sometimes")


# --- with a GPU ---------------------------------------------------------------------------------

ADD_ONE = r"""
extern "C" __global__ void add_one(int* data, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1;
}
"""


@pytest.fixture(scope="module")
def torch():
    if not cubridge.driver_available():
        pytest.skip("no CUDA driver here")
    torch = pytest.importorskip("torch")
    torch.zeros(1, device="cuda")  # torch's primary context, current on this thread
    return torch


def shared_ints(torch, n):
    """SharedMemory of at least n ints and a torch int32 view of all of it, filled 0, 1, ..."""
    memory = cubridge.SharedMemory(4 * n)
    data = torch.as_tensor(memory, device="cuda").view(torch.int32)
    assert data.data_ptr() == memory.address and data.numel() * 4 == memory.nbytes
    data.copy_(torch.arange(data.numel(), device="cuda", dtype=torch.int32))
    torch.cuda.synchronize()
    return memory, data


@needs_driver
def test_a_library_call_in_a_guest_context_leaves_torch_and_its_context_alone(torch):
    x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    primary = cubridge.PrimaryContext.adopt_runtime()
    before = cubridge.current_context()
    assert before.handle == primary.handle
    guest = cubridge.GuestContext(name="vendor-lib")  # watches the active primary itself
    assert guest.name == "vendor-lib" and guest.context.handle != primary.handle
    memory, data = shared_ints(torch, 1 << 16)
    n = data.numel()
    add_one = cubridge.Module.from_source(ADD_ONE, guest).get_kernel("add_one")
    guest.watch("x", x)
    guest.watch("shared", memory)

    def library_call(step):  # a third-party library's entry point, as far as the host knows
        assert cubridge.current_context().handle == guest.context.handle
        add_one.launch(cubridge.LaunchConfig(grid=(n + 255) // 256, block=256), memory, n)
        return step

    with guest:
        assert library_call("first") == "first"
    assert cubridge.current_context() == before
    assert guest.call(library_call, step="second") == "second"
    assert cubridge.current_context() == before
    guest.check_host()
    expected = torch.arange(n, device="cuda", dtype=torch.int32) + 2
    assert torch.equal(data, expected), "the guest's kernel worked on the host's memory in place"
    torch.testing.assert_close(x * 2, torch.arange(1 << 16, device="cuda") * 2.0)
    assert not primary.was_reset
    guest.unwatch(x)
    guest.unwatch(memory)


@needs_driver
def test_what_a_guest_block_raises_propagates_with_the_stack_restored(torch):
    before = cubridge.current_context()
    guest = cubridge.GuestContext()
    with pytest.raises(ZeroDivisionError):
        with guest:
            assert cubridge.current_context().handle == guest.context.handle
            1 / 0
    assert cubridge.current_context() == before
    with pytest.raises(KeyError):
        guest.call(lambda: {}["missing"])
    assert cubridge.current_context() == before


@needs_driver
def test_guest_with_blocks_nest_and_must_be_left_innermost_first(torch):
    before = cubridge.current_context()
    outer, inner = cubridge.GuestContext(name="outer"), cubridge.GuestContext(name="inner")
    with outer:
        with inner:
            assert cubridge.current_context().handle == inner.context.handle
        assert cubridge.current_context().handle == outer.context.handle
    assert cubridge.current_context() == before
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(cubridge.PreconditionError, match="'outer' left on a thread where it is "
                                                         "not the innermost"):
        outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    outer.__exit__(None, None, None)
    assert cubridge.current_context() == before


@needs_driver
def test_a_guest_context_is_a_context_what_is_made_in_it_keeps_alive(torch):
    guest = cubridge.GuestContext(name="owner")
    handle = guest.context.handle
    module = cubridge.Module.from_source(ADD_ONE, guest)
    stream = cubridge.Stream(guest)
    assert module.context.handle == handle
    del guest  # the module and the stream hold the guest's context
    memory, data = shared_ints(torch, 256)
    with cubridge.scoped_current(module.context):  # a launch runs in the current context
        module.get_kernel("add_one").launch(cubridge.LaunchConfig(block=256, stream=stream),
                                            memory, 256)
    stream.synchronize()
    assert int(data[255]) == 256


@needs_driver
def test_watching_refuses_what_is_not_device_memory(torch):
    guest = cubridge.GuestContext()
    with pytest.raises(cubridge.PreconditionError, match="on the CPU"):
        guest.watch("cpu", torch.zeros(4))
    with pytest.raises(cubridge.PreconditionError, match="is no device memory"):
        guest.watch("list", [1, 2])
    guest.watch_primary(cubridge.PrimaryContext.adopt_runtime())
    guest.check_host()


@needs_driver
def test_torch_keeps_working_after_cubridge_adopted_its_context(torch):
    n = 1 << 16
    x = torch.arange(n, device="cuda", dtype=torch.float32)
    ctx = cubridge.PrimaryContext.adopt_runtime()
    scale = cubridge.Module.from_source(r"""
        extern "C" __global__ void scale(float* x, float by, int n) {
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) x[i] *= by;
        }""", ctx).get_kernel("scale")
    stream = torch.cuda.current_stream()
    scale.launch(cubridge.LaunchConfig(grid=n // 256, block=256, stream=stream), x, 2.0, n)
    ones = torch.ones(64, 64, device="cuda")
    assert torch.equal(ones @ ones, torch.full((64, 64), 64.0, device="cuda")), "cuBLAS works"
    expected = torch.arange(n, device="cuda", dtype=torch.float32) * 2
    assert torch.equal(x, expected), "cubridge's launch ran on torch's stream, in order"
    del ctx, scale  # cubridge's retain released: torch's context stays
    assert torch.equal(x + 1, expected + 1)
    assert cubridge.current_context() is not None


@needs_driver
def test_the_sandbox_runs_a_cuda_library_on_shared_memory_torch_reads(torch, guest_library):
    memory, data = shared_ints(torch, 1 << 20)
    start = torch.arange(data.numel(), device="cuda", dtype=torch.int32)
    host_tensor = torch.ones(1 << 16, device="cuda")
    with cubridge.Sandbox(guest_library, name="vendor") as box:
        assert box.worker_cuda_status == ""
        assert box.call("guest_add_one", buffers=[memory]) == (0, b"")
        torch.cuda.synchronize()
        assert torch.equal(data, start + 1), "the worker's kernel wrote the host's memory"

        pid = box.worker_pid
        with pytest.raises(cubridge.SandboxError) as caught:
            box.call("guest_write_invalid_address")
        assert caught.value.reason == "cuda_fault" and caught.value.restarted
        with pytest.raises(cubridge.SandboxError) as caught:
            box.call("guest_abort")
        assert caught.value.reason == "aborted" and caught.value.restarted
        assert box.worker_pid != pid and box.restarts == 2

        assert box.call("guest_add_one", buffers=memory) == (0, b""), "mapped again"
        torch.cuda.synchronize()
        assert torch.equal(data, start + 2)
        assert float(host_tensor.sum()) == 1 << 16, "the worker's fault left the host alone"

        box.unshare(memory)
        assert box.call("guest_add_one", buffers=[memory])[0] == 0, "shared again"
        with pytest.raises(cubridge.PreconditionError) as caught:
            box.call("guest_add_one", buffers=[host_tensor])
        assert "buffer 0 is a torch.Tensor" in str(caught.value)
        assert "cubridge.SharedMemory" in str(caught.value)
        with pytest.raises(cubridge.PreconditionError):
            box.call("guest_add_one", buffers=[cubridge.SharedMemory(4096, exportable=False)])


# --- with a GPU, each in a process of its own (a reset ends what torch holds) -----------------

LOAD_CUDART = """
import ctypes, os

def load_cudart():
    # The runtime torch loaded, else the toolkit's: either one's cudaDeviceReset resets the
    # device's primary context through the driver.
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if os.path.basename(path).startswith("libcudart.so"):
            return ctypes.CDLL(path)
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so",
                 "/usr/local/cuda/lib64/libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise SystemExit("no libcudart found")
"""


def run_python(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Runs `script` in a fresh interpreter; returns its output, failing with it if it failed."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}:\n{output}"
    return output


RESET_BY_THE_HOSTS_RUNTIME = LOAD_CUDART + """
import os, sys
import torch, cubridge

n = 1 << 16
x = torch.arange(n, device="cuda", dtype=torch.float32)
primary = cubridge.PrimaryContext.adopt_runtime()
print("cudaDeviceReset:", load_cudart().cudaDeviceReset(), flush=True)
print("primary reset:", primary.was_reset, flush=True)
if primary.was_reset:
    os._exit(0)  # torch's memory is gone; its teardown would fail
y = x * 2
torch.cuda.synchronize()
assert torch.equal(y.cpu(), torch.arange(n, dtype=torch.float32) * 2), "torch's tensors broke"
print("torch works")
"""


@needs_driver
def test_torch_survives_a_library_reset_with_the_reset_guard_preloaded(torch, tmp_path,
                                                                       reset_guard_library):
    unguarded = run_python(RESET_BY_THE_HOSTS_RUNTIME)
    assert "primary reset: True" in unguarded, "without the guard the reset must show"
    log = tmp_path / "resets.log"
    guarded = run_python(RESET_BY_THE_HOSTS_RUNTIME, env={
        "LD_PRELOAD": str(reset_guard_library), "CUBRIDGE_RESET_POLICY": "deny",
        "CUBRIDGE_RESET_LOG": str(log)})
    assert "cudaDeviceReset: 0" in guarded and "primary reset: False" in guarded, guarded
    assert "torch works" in guarded
    assert "policy=deny" in log.read_text() and "call=cuDevicePrimaryCtxReset" in log.read_text()


GUEST_RESETS = """
import ctypes, os, sys
import torch, cubridge

library = ctypes.CDLL(sys.argv[1])
x = torch.ones(1 << 16, device="cuda")
guest = cubridge.GuestContext(name="resetter")
guest.watch("x", x)
assert guest.call(library.guest_init, None) == 0
if sys.argv[2] == "own-call":
    print("reset returned", guest.call(library.guest_reset, None))
    guest.check_host()
    assert float(x.sum()) == 1 << 16, "torch's tensor broke"
    print("host intact")
else:
    try:
        guest.call(library.guest_reset_from_own_thread, None)
    except cubridge.GuestError as e:
        assert e.guest == "resetter"
        assert e.broke("primary_context_reset") and e.broke("host_buffer_lost"), e.findings
        print("reported:", e, flush=True)
        os._exit(0)  # torch's memory is gone; its teardown would fail
    raise SystemExit("no GuestError after a reset from the library's own thread")
"""


@needs_driver
def test_a_reset_in_a_guest_call_leaves_torch_intact(torch, guest_library):
    assert "host intact" in run_python(GUEST_RESETS, str(guest_library), "own-call")


@needs_driver
def test_a_reset_from_the_librarys_own_thread_is_reported_by_the_guest(torch, guest_library):
    output = run_python(GUEST_RESETS, str(guest_library), "own-thread")
    assert "reported:" in output and "guest 'resetter' broke the host's state" in output
