"""On a GPU with torch: hot custom ops (cubridge.torch) in eager mode, under torch.cuda.graph and
under torch.compile (fullgraph, and reduce-overhead, which captures CUDA graphs), before and after
a promote and a rollback, against torch's own computation; captured graphs retargeted while
another thread replays them; Triton kernels as hot versions; prewarm.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time

import pytest

import cubridge

pytestmark = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
import cubridge.torch as ct  # noqa: E402  (after the skips: it needs torch)

SOURCE = r"""
extern "C" __global__ void affine(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * SCALE + OFFSET;
}
"""
AFFINE = {1: (2.0, 1.0), 2: (3.0, -1.0)}  # version -> (scale, offset)
_names = itertools.count()


def reference(version, x):
    scale, offset = AFFINE[version]
    return x * scale + offset


def image(ctx, version):
    scale, offset = AFFINE[version]
    # No fused multiply-add: torch rounds the product and the sum apart.
    return cubridge.compile_cuda(SOURCE, ctx.device.compute_capability, options=["--fmad=false"],
                                 defines={"SCALE": f"{scale}f", "OFFSET": f"{offset}f"})


@pytest.fixture
def hot(ctx):
    return cubridge.HotModule(f"affine{next(_names)}", image(ctx, 1), ctx)


def affine_op(hot):
    """A fresh op (torch.library names are process-wide) computing y = affine(x)."""
    name = f"cubridge_test::affine{next(_names)}"

    @ct.custom_op(name, hot, "affine")
    def op(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        ct.launch(grid=(x.numel() + 255) // 256, block=256, args=(y, x, x.numel()))
        return y

    return op


def switch(hot, ctx, to):
    """Promote v2 (to=2) or roll back to v1 (to=1)."""
    if to == 2:
        assert hot.promote(hot.stage(image(ctx, 2))) == hot.stats.current_id
    else:
        hot.rollback()


def test_the_op_runs_the_serving_version_in_eager_mode_and_says_which(ctx, hot):
    op = affine_op(hot)
    x = torch.randn(10_000, device="cuda")
    for version in (1, 2, 1):
        if version != hot.stats.current_id:
            switch(hot, ctx, version)
        assert torch.equal(op(x), reference(version, x))
        assert op.last_version == hot.stats.current_id
    assert torch.equal(getattr(torch.ops.cubridge_test, op.qualname.split("::")[1])(x),
                       reference(1, x)), "torch.ops reaches the same op"


def test_a_captured_graph_follows_promote_and_rollback_without_recapture(ctx, hot):
    op = affine_op(hot)
    x = torch.randn(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(x)  # warm-up outside the capture, as torch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = op(x)
    assert ct.graph_versions(graph) == {hot.name: 1}
    [followed] = hot.graphs
    assert followed["nodes"] == 1 and followed["version"] == 1
    for version in (1, 2, 1, 2):
        if version != hot.stats.current_id:
            switch(hot, ctx, version)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, reference(version, x)), f"replay after switching to v{version}"
        # The serving version's id (each promote of a fresh stage makes a new one).
        assert ct.graph_versions(graph) == {hot.name: hot.stats.current_id}
    del graph
    gc.collect()
    assert hot.graphs == [], "a collected graph is no longer followed"


def test_a_graph_made_with_keep_graph_false_is_refused_by_name(ctx, hot):
    op = affine_op(hot)
    x = torch.randn(256, device="cuda")
    op(x)
    graph = torch.cuda.CUDAGraph(keep_graph=False)
    try:
        with pytest.raises(cubridge.PreconditionError,
                           match=r"keep_graph=False.*could not follow"):
            with torch.cuda.graph(graph):
                op(x)
    finally:  # torch's graph context may leave its capture stream current when capture_end raises
        torch.cuda.set_stream(torch.cuda.default_stream())
    assert hot.graphs == []


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_the_op_under_torch_compile_follows_promote_and_rollback(ctx, hot, mode):
    op = affine_op(hot)
    torch._dynamo.reset()

    def model(x):
        return op(x * 0.5) + 1.0

    compiled = torch.compile(model, fullgraph=True, mode=mode)
    x = torch.randn(8192, device="cuda")
    for version in (1, 2, 1):
        if version != hot.stats.current_id:
            switch(hot, ctx, version)
        for _ in range(4):  # reduce-overhead: warm-up, record, then replays
            out = compiled(x).clone()
            torch.cuda.synchronize()
            assert torch.equal(out, reference(version, x * 0.5) + 1.0), f"v{version}, {mode}"
    if mode == "reduce-overhead":
        assert hot.graphs, "torch.compile's CUDA graph is followed"


def test_replays_on_another_thread_never_run_a_mix_of_versions(ctx, hot):
    op = affine_op(hot)
    x = torch.randn(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        first = op(x)
        second = op(first * 0 + x)  # a second hot node, after a torch kernel
    expected = {v: reference(v, x) for v in (1, 2)}
    stop, failures, replays = threading.Event(), [], [0]

    def replay():
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    graph.replay()
                    stream.synchronize()
                    got = [v for v in (1, 2) if torch.equal(first, expected[v])]
                    if len(got) != 1 or not torch.equal(second, expected[got[0]]):
                        failures.append(f"replay {replays[0]}: a mix of versions")
                        return
                    replays[0] += 1
        except Exception as e:  # reported below, with the switch count
            failures.append(repr(e))

    thread = threading.Thread(target=replay)
    thread.start()
    switches = 0
    try:
        while switches < 40 and not failures:
            switch(hot, ctx, 2 if hot.stats.current_id == 1 else 1)
            switches += 1
            before = replays[0]
            while replays[0] == before and not failures and thread.is_alive():
                time.sleep(0.001)  # let at least one replay run on each version
    finally:
        stop.set()
        thread.join()
    assert failures == [], failures
    assert switches == 40 and replays[0] >= 40
    hot.reclaim()
    assert hot.stats.reclaim_failures == 0
    assert cubridge.health() is None


def test_launch_outside_an_op_and_an_unknown_kernel_are_refused(hot):
    with pytest.raises(cubridge.PreconditionError, match="inside the body of a"):
        ct.launch(grid=1, block=1, args=())
    with pytest.raises(cubridge.PreconditionError):
        ct.custom_op(f"cubridge_test::bad{next(_names)}", hot, "no_such_kernel")(lambda: None)


def test_the_op_checks_its_launch_arguments(hot):
    @ct.custom_op(f"cubridge_test::short{next(_names)}", hot, "affine")
    def short(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        ct.launch(grid=1, block=256, args=(y, x))  # n is missing
        return y

    with pytest.raises(cubridge.LaunchArgumentError):
        short(torch.zeros(16, device="cuda"))


def test_prewarm_loads_the_kernels_and_runs_the_warm_up_launch(ctx, hot):
    x = torch.randn(256, device="cuda")
    y = torch.empty_like(x)
    kernel = hot.get_kernel("affine")
    config = cubridge.LaunchConfig(grid=1, block=256, stream=torch.cuda.current_stream())
    steps = hot.prewarm((kernel, config, y, x, 0))
    assert [s["what"] for s in steps] == ["kernel 'affine' loaded",
                                         "warm-up launch of 'affine'"]
    assert all(s["milliseconds"] >= 0 for s in steps)
    kernel.launch(config, y, x, x.numel())
    torch.cuda.synchronize()
    assert torch.equal(y, reference(1, x))
    with pytest.raises(cubridge.PreconditionError, match="cannot prewarm a str"):
        cubridge.prewarm("affine")


# -- Triton ---------------------------------------------------------------------------------------

def triton_versions():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")
    from triton.compiler import ASTSource

    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)

    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "FACTOR": "constexpr",
                 "BLOCK": "constexpr"}
    return {factor: triton.compile(ASTSource(scale_kernel, signature,
                                             constexprs={"FACTOR": factor, "BLOCK": 256}))
            for factor in (2.0, 3.0)}


def test_a_triton_kernel_goes_v1_v2_rollback_in_eager_mode_and_in_a_graph(ctx):
    versions = triton_versions()
    k = ct.TritonKernel(f"triton{next(_names)}", versions[2.0], ctx)
    assert k.spec.parameters == ("x_ptr", "out_ptr", "n") and k.spec.block == 128

    @ct.custom_op(f"cubridge_test::triton_scale{next(_names)}", k)
    def scale(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        ct.launch(grid=((x.numel() + 255) // 256,), args=(x, out, x.numel()))
        return out

    x = torch.randn(10_000, device="cuda")
    direct = torch.empty_like(x)
    k.launch(((x.numel() + 255) // 256,), x, direct, x.numel())
    torch.cuda.synchronize()
    assert torch.equal(direct, x * 2.0)
    scale(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = scale(x)
    for factor, change in ((2.0, None), (3.0, "promote"), (2.0, "rollback")):
        if change == "promote":
            k.hot.promote(k.stage(versions[3.0]))
        elif change == "rollback":
            k.hot.rollback()
        assert torch.equal(scale(x), x * factor), f"eager after {change}"
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, x * factor), f"graph replay after {change}"
    with pytest.raises(cubridge.LaunchArgumentError, match="takes 3 arguments"):
        k.launch(1, x, direct)
