"""On a GPU: a version staged on probation from Python while a Python thread serves the current
one. A wrong candidate is refused with ProbationError naming the kernel, the buffer and the first
differing offset; the serving thread never stops and this process is never poisoned."""

from __future__ import annotations

import threading
import time

import pytest

import cubridge

pytestmark = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")

SOURCE = r"""
extern "C" __global__ void scale(float* out, const float* in, float factor, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = in[i] * factor;
#if WRONG
  if (i == 37) v += 1.0f;
#endif
  out[i] = v;
}
"""


def build(ctx, wrong):
    return cubridge.compile_cuda(SOURCE, ctx.device.compute_capability,
                                 defines={"WRONG": "1" if wrong else "0"})


def allocation_offset(torch, tensor):
    """Where `tensor` starts in the driver allocation torch carved it from: probation copies
    whole allocations, so its offsets count from there."""
    address = tensor.data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= address < segment["address"] + segment["total_size"]:
            return address - segment["address"]
    pytest.skip("torch's memory snapshot shows no segment holding the tensor")


def eventually(condition, timeout_s=60.0):
    """Polls `condition` until it holds; the deadline only catches a hang."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_wrong_candidate_on_probation_is_refused_while_a_python_thread_serves(torch, ctx):
    hot = cubridge.HotModule("scaler", build(ctx, wrong=False), ctx)
    scale = hot.get_kernel("scale")
    n = 1 << 16
    x = torch.arange(n, device="cuda", dtype=torch.float32) * 0.5
    out = torch.zeros_like(x)
    torch.cuda.synchronize()
    stop = threading.Event()
    failures, served = [], [0]

    def serve():
        try:
            with ctx:  # a module's kernels launch in its context: current on this thread
                stream = torch.cuda.Stream()
                config = cubridge.LaunchConfig(grid=n // 256, block=256, stream=stream)
                while not stop.is_set():
                    scale.launch(config, out, x, 2.0, n)
                    stream.synchronize()
                    if float(out[37]) != 37 * 0.5 * 2.0:
                        failures.append(f"out[37] read {float(out[37])}")
                    served[0] += 1
        except Exception as error:  # noqa: BLE001 - every failure is what the test counts
            failures.append(repr(error))

    server = threading.Thread(target=serve)
    server.start()
    try:
        eventually(lambda: served[0] > 0 or failures)
        policy = cubridge.ProbationPolicy(required_launches=4, sample_every=3, deadline_s=60)
        with pytest.raises(cubridge.ProbationError) as refused:
            hot.stage(build(ctx, wrong=True), probation=policy, source_name="wrong.cu")
        before = served[0]
        eventually(lambda: served[0] > before + 3 or failures)
    finally:
        stop.set()
        server.join()

    e = refused.value
    assert isinstance(e, cubridge.VersionRejected)
    assert e.verdict == "mismatch_in_probation", str(e)
    assert "mismatch_in_probation" in str(e)
    assert (e.kernel, e.launch, e.parameter) == ("scale", 1, 0)  # parameter 0: out
    # The first differing byte lies inside element 37 (which byte depends on the float's bits).
    assert (e.offset - allocation_offset(torch, out)) // 4 == 37, e.offset
    assert failures == []
    assert hot.versions["serving"]["id"] == 1
    assert hot.stats.rejected == 1
    assert cubridge.health() is None, "the serving process was poisoned"
