"""On a GPU: hot modules from Python: stage with a Python smoke test, promote, rollback, swaps
under launches from Python threads, reloading from a watched directory."""

from __future__ import annotations

import threading
import time

import pytest

import cubridge

pytestmark = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")

SOURCE = r"""
__global__ void tag(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * SCALE + VERSION;
}
"""


def build(ctx, version, scale=1):
    return cubridge.compile_cuda(SOURCE, ctx.device.compute_capability,
                                 defines={"VERSION": str(version), "SCALE": str(scale)})


def expect(torch, out, x, version, scale=1):
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * scale + version)


def test_stage_promote_and_rollback_switch_torch_launches(torch, ctx):
    hot = cubridge.HotModule("tagger", build(ctx, 1), ctx)
    tag = hot.get_kernel("tag")
    n = 4096
    x = torch.arange(n, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    config = cubridge.LaunchConfig(grid=n // 256, block=256, stream=torch.cuda.current_stream())
    assert tag.launch(config, out, x, n) == 1
    expect(torch, out, x, 1)

    checked = []

    def smoke_test(staged):
        probe = torch.zeros(256, device="cuda")
        staged.get_kernel("tag").launch(cubridge.LaunchConfig(block=256), probe, probe, 256)
        torch.cuda.synchronize()
        checked.append(float(probe[0]))
        assert float(probe[0]) == 2.0, "v2 adds 2"

    v2 = hot.stage(build(ctx, 2), smoke_test=smoke_test, source_name="v2.cu")
    assert checked == [2.0]
    assert tag.launch(config, out, x, n) == 1, "staged is not serving"
    assert hot.promote(v2) == 2
    assert tag.launch(config, out, x, n) == 2
    expect(torch, out, x, 2)
    assert hot.versions["serving"]["source"] == "v2.cu"
    assert hot.rollback() == 1
    assert tag.launch(config, out, x, n) == 1
    expect(torch, out, x, 1)
    stats = hot.stats
    assert (stats.current_id, stats.promotions, stats.rollbacks) == (1, 2, 1)


def test_a_failing_python_smoke_test_rejects_the_version_and_v1_keeps_serving(torch, ctx):
    hot = cubridge.HotModule("guarded", build(ctx, 1), ctx)

    def smoke_test(staged):
        raise ValueError("output differs from torch's")

    with pytest.raises(cubridge.VersionRejected, match="output differs from torch's"):
        hot.stage(build(ctx, 2), smoke_test=smoke_test)
    with pytest.raises(cubridge.VersionRejected, match="kernel 'tag'|tag"):
        hot.stage(cubridge.compile_cuda("__global__ void other(int* p) {}",
                                        ctx.device.compute_capability))
    assert hot.stats.rejected == 2
    n = 256
    x = torch.ones(n, device="cuda")
    out = torch.empty_like(x)
    assert hot.get_kernel("tag").launch(cubridge.LaunchConfig(block=256), out, x, n) == 1
    expect(torch, out, x, 1)


def test_the_staged_module_is_usable_only_during_the_smoke_test(ctx):
    hot = cubridge.HotModule("leaky", build(ctx, 1), ctx)
    kept = []
    hot.stage(build(ctx, 2), smoke_test=kept.append)
    with pytest.raises(cubridge.PreconditionError, match="only while the test runs"):
        kept[0].get_kernel("tag")


def test_swaps_under_launches_from_python_threads_fail_no_launch(torch, ctx):
    hot = cubridge.HotModule("busy", build(ctx, 1), ctx)
    tag = hot.get_kernel("tag")
    n = 1 << 16
    versions = [build(ctx, v) for v in (1, 2, 3)]
    stop = threading.Event()
    failures, launches, seen = [], [0] * 4, [set() for _ in range(4)]

    def serve(index):
        try:
            with ctx:  # a module's kernels launch in its context: current on this thread
                run(index)
        except Exception as error:  # noqa: BLE001 - every failure is what the test counts
            failures.append(repr(error))

    def run(index):
        stream = torch.cuda.Stream()
        x = torch.ones(n, device="cuda")
        out = torch.empty_like(x)
        config = cubridge.LaunchConfig(grid=n // 256, block=256, stream=stream)
        while not stop.is_set():
            seen[index].add(tag.launch(config, out, x, n))
            launches[index] += 1
            if launches[index] % 64 == 0:
                stream.synchronize()
                value = float(out[0])
                if value not in (2.0, 3.0, 4.0):
                    failures.append(f"thread {index} read {value}")
        stream.synchronize()

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    swaps = 0
    for round_ in range(30):
        hot.promote(hot.stage(versions[1 + round_ % 2]))
        swaps += 1
        if round_ % 5 == 4:
            hot.rollback()
            swaps += 1
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    assert all(count > 0 for count in launches), launches
    assert hot.stats.promotions == swaps
    assert len(set().union(*seen)) > 2, "launches saw several versions"
    torch.cuda.synchronize()
    hot.reclaim()
    assert hot.stats.retired_waiting <= 1


def test_a_file_dropped_in_a_watched_directory_is_promoted(torch, ctx, tmp_path):
    hot = cubridge.HotModule("watched", build(ctx, 1), ctx)
    promoted, refused = threading.Event(), []
    ids = []

    def on_promoted(path, version_id):
        ids.append((path, version_id))
        promoted.set()

    with hot.reload_from(str(tmp_path), on_promoted=on_promoted,
                         on_refused=lambda path, error: refused.append(error),
                         debounce_ms=50):
        (tmp_path / "broken.cu").write_text("__global__ void tag(float* out) { syntax error }")
        deadline = time.monotonic() + 60
        while not refused and time.monotonic() < deadline:
            time.sleep(0.01)
        assert refused and isinstance(refused[0], cubridge.Error)
        (tmp_path / "v2.cu").write_text("#define VERSION 2\n#define SCALE 1\n" + SOURCE)
        assert promoted.wait(60), "v2.cu was never promoted"
    assert ids[0][1] == 2 and ids[0][0].endswith("v2.cu")
    n = 256
    x = torch.ones(n, device="cuda")
    out = torch.empty_like(x)
    assert hot.get_kernel("tag").launch(cubridge.LaunchConfig(block=256), out, x, n) == 2
    expect(torch, out, x, 2)


def test_cupy_arrays_go_through_hot_kernels_across_a_swap(ctx):
    cupy = pytest.importorskip("cupy")
    hot = cubridge.HotModule("cupy-tagger", build(ctx, 1, scale=3), ctx)
    tag = hot.get_kernel("tag")
    n = 2048
    x = cupy.arange(n, dtype=cupy.float32)
    out = cupy.empty_like(x)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        config = cubridge.LaunchConfig(grid=n // 256, block=256, stream=stream)
        assert tag.launch(config, out, x, n) == 1
        stream.synchronize()
        assert bool(cupy.allclose(out, x * 3 + 1))
        hot.promote(hot.stage(build(ctx, 2, scale=3)))
        assert tag.launch(config, out, x, n) == 2
        stream.synchronize()
        assert bool(cupy.allclose(out, x * 3 + 2))
