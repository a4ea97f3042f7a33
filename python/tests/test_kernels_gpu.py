"""On a GPU: modules and kernels from source, launches with torch and CuPy tensors, contexts."""

from __future__ import annotations

import pytest

import cubridge

needs_driver = pytest.mark.skipif(not cubridge.driver_available(), reason="no CUDA driver here")
pytestmark = needs_driver

SOURCE = r"""
extern "C" __global__ void fill(float* x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}
template <class T> __global__ void axpy(T* y, const T* x, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
template __global__ void axpy<float>(float*, const float*, float, int);
template __global__ void axpy<double>(double*, const double*, double, int);
__global__ void mixed(long long* out, unsigned char c, bool b, double d, short s) {
  out[0] = c; out[1] = b; out[2] = (long long)(d * 2); out[3] = s;
}
template <class T> __global__ void set(T* x, T v, int n) {
  if (threadIdx.x < n) x[threadIdx.x] = v;
}
template __global__ void set<float>(float*, float, int);
__device__ int counter = 41;
"""


@pytest.fixture(scope="module")
def mod(ctx):
    return cubridge.Module.from_source(SOURCE, ctx, name="test_kernels_gpu.cu")


def config_for(n, stream=None):
    return cubridge.LaunchConfig(grid=(n + 255) // 256, block=256, stream=stream)


def test_adopt_runtime_takes_the_context_torch_uses(torch, ctx):
    current = cubridge.current_context()
    assert current is not None and current.handle == ctx.handle
    assert ctx.device == cubridge.Device(torch.cuda.current_device())
    assert not ctx.was_reset


def test_a_torch_tensor_goes_through_a_kernel_on_torchs_stream(torch, mod):
    n = 10_000
    x = torch.empty(n, device="cuda")
    stream = torch.cuda.current_stream()
    mod.get_kernel("fill").launch(config_for(n, stream), x, 2.5, n)
    y = torch.ones(n, device="cuda")
    mod.get_kernel("axpy<float>").launch(config_for(n, stream), y, x, 3.0, n)
    torch.testing.assert_close(y, torch.full((n,), 3.0 * 2.5 + 1.0, device="cuda"))


def test_double_tensors_and_every_scalar_kind_convert_to_the_parameter_types(torch, mod):
    n = 1000
    y = torch.zeros(n, device="cuda", dtype=torch.float64)
    x = torch.arange(n, device="cuda", dtype=torch.float64)
    mod.get_kernel("axpy<double>").launch(config_for(n), y, x, 0.5, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 0.5)
    out = torch.zeros(4, device="cuda", dtype=torch.int64)
    mixed = mod.get_kernel("mixed")
    assert mixed.signature == ["long long*", "unsigned char", "bool", "double", "short"]
    mixed.launch(cubridge.LaunchConfig(), out, 200, True, 4, -7)  # 4: an int for a double
    torch.cuda.synchronize()
    assert out.tolist() == [200, 1, 8, -7]


def test_cupy_arrays_and_streams_work_as_torch_tensors_do(mod):
    cupy = pytest.importorskip("cupy")
    n = 4096
    x = cupy.empty(n, dtype=cupy.float32)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        mod.get_kernel("fill").launch(config_for(n, stream), x, 7.0, n)
        stream.synchronize()
    assert float(x.sum()) == 7.0 * n


def test_cuda_array_interface_and_dlpack_objects_pass_their_address(torch, mod):
    n = 512
    t = torch.zeros(n, device="cuda")

    class InterfaceOnly:  # e.g. a Numba device array
        __cuda_array_interface__ = t.__cuda_array_interface__

    class DLPackOnly:  # e.g. a JAX array
        def __dlpack__(self, **kwargs):
            return t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return t.__dlpack_device__()

    fill = mod.get_kernel("fill")
    fill.launch(config_for(n), InterfaceOnly(), 1.0, n)
    torch.cuda.synchronize()
    assert float(t.sum()) == n
    fill.launch(config_for(n), DLPackOnly(), 2.0, n)
    torch.cuda.synchronize()
    assert float(t.sum()) == 2 * n


@pytest.mark.parametrize("arguments, message", [
    (lambda t, n: (t, 1.0), "takes 3 parameters, 2 arguments given"),
    (lambda t, n: (t, 1.0, 2.5), r"parameter 2 \(int\): a float was given"),
    (lambda t, n: (t, 1.0, 2**40), r"parameter 2 \(int\): the int given .* does not fit in 4"),
    (lambda t, n: (t, 1.0, 2**70), r"parameter 2 \(int\): the int given does not fit in 4"),
    (lambda t, n: (t.cpu(), 1.0, n), "a torch tensor on the CPU"),
    (lambda t, n: (1.0, 1.0, n), r"parameter 0 \(float\*\): a float was given"),
    (lambda t, n: (t, t, n), r"parameter 1 \(float\): a device array"),
    (lambda t, n: (t, "x", n), "a str was given"),
])
def test_bad_arguments_are_refused_before_anything_launches(torch, mod, arguments, message):
    n = 256
    t = torch.zeros(n, device="cuda")
    typed = mod.get_kernel("set")
    assert typed.signature == ["float*", "float", "int"]
    with pytest.raises(cubridge.LaunchArgumentError, match=message):
        typed.launch(config_for(n), *arguments(t, n))
    torch.cuda.synchronize()
    assert float(t.abs().sum()) == 0.0, "nothing ran"


def test_a_numpy_array_is_host_memory_and_refused(mod):
    numpy = pytest.importorskip("numpy")
    with pytest.raises(cubridge.LaunchArgumentError, match="host memory|host array"):
        mod.get_kernel("fill").launch(config_for(8), numpy.zeros(8, numpy.float32), 1.0, 8)


def test_numpy_scalars_pass_their_bytes(torch, mod):
    numpy = pytest.importorskip("numpy")
    t = torch.zeros(16, device="cuda")
    mod.get_kernel("fill").launch(config_for(16), t, numpy.float32(4.5), numpy.int32(16))
    torch.cuda.synchronize()
    assert t.tolist() == [4.5] * 16
    # numpy.float64 is a Python float (converted); numpy.int64 is not an int: its 8 bytes are
    # refused for a 4-byte parameter.
    with pytest.raises(cubridge.LaunchArgumentError, match="is 4 bytes, the numpy.int64 given is 8"):
        mod.get_kernel("fill").launch(config_for(16), t, numpy.float64(1.0), numpy.int64(16))


def test_a_kernel_name_that_means_several_kernels_is_refused(mod):
    with pytest.raises(cubridge.PreconditionError, match="names several kernels"):
        mod.get_kernel("axpy")
    assert sorted(mod.kernel_names) == sorted(
        ["fill", "_Z4axpyIfEvPT_PKS0_S0_i", "_Z4axpyIdEvPT_PKS0_S0_i", "_Z5mixedPxhbds",
         "_Z3setIfEvPT_S0_i"])
    axpy = mod.get_kernel("axpy<float>")
    assert axpy.signature == ["float*", "float const*", "float", "int"]
    assert mod.get_kernel("_Z4axpyIfEvPT_PKS0_S0_i").name == axpy.name


def test_a_device_global_is_a_device_view_torch_can_wrap(torch, mod):
    view = mod.get_global("counter")
    assert view.nbytes == 4
    as_int = torch.as_tensor(view, device="cuda").view(torch.int32)
    assert int(as_int[0]) == 41


def test_an_owned_context_is_a_with_block_and_restores_the_stack(torch, ctx):
    mine = cubridge.Context.create(cubridge.Device(0))
    assert mine.handle != ctx.handle
    with mine:
        assert cubridge.current_context().handle == mine.handle
        with cubridge.scoped_current(ctx):
            assert cubridge.current_context().handle == ctx.handle
        m = cubridge.Module.from_source(SOURCE, name="in_own_context.cu")  # the current one
        assert m.context.handle == mine.handle
    assert cubridge.current_context().handle == ctx.handle
    torch.testing.assert_close(torch.ones(3, device="cuda").sum(), torch.tensor(3.0, device="cuda"))


def test_streams_of_cubridge_torch_and_cuda_core_are_taken(torch, ctx, mod):
    n = 1024
    t = torch.zeros(n, device="cuda")
    own = cubridge.Stream(ctx)
    mod.get_kernel("fill").launch(config_for(n, own), t, 1.0, n)
    own.synchronize()
    assert float(t.sum()) == n
    side = torch.cuda.Stream()
    mod.get_kernel("fill").launch(config_for(n, side), t, 2.0, n)
    side.synchronize()
    assert float(t.sum()) == 2 * n
    try:
        from cuda.core import Device as CoreDevice
    except ImportError:
        try:
            from cuda.core.experimental import Device as CoreDevice
        except ImportError:
            pytest.skip("cuda.core is not installed")
    device = CoreDevice(0)
    device.set_current()
    core_stream = device.create_stream()
    mod.get_kernel("fill").launch(config_for(n, core_stream), t, 3.0, n)
    core_stream.sync()
    assert float(t.sum()) == 3 * n


def test_torch_keeps_working_after_adopt_and_kernels(torch, ctx, mod):
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    mod.get_kernel("fill").launch(config_for(10), torch.empty(10, device="cuda"), 0.0, 10)
    torch.testing.assert_close(a @ b, (a.double() @ b.double()).float(), rtol=1e-3, atol=1e-3)
    assert not ctx.was_reset


def test_a_launch_without_a_launch_config_is_refused(mod):
    fill = mod.get_kernel("fill")
    with pytest.raises(cubridge.PreconditionError, match="takes a cubridge.LaunchConfig first"):
        fill.launch((1, 1), None, 1.0, 1)
    with pytest.raises(cubridge.PreconditionError, match="needs a config"):
        fill.launch()


def test_a_launch_made_while_converting_another_keeps_both_argument_lists(torch, mod):
    n = 256
    inner, outer = torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda")
    fill = mod.get_kernel("fill")

    class LaunchesWhenAsked:  # its array interface launches a kernel of its own
        @property
        def __cuda_array_interface__(self):
            fill.launch(config_for(n), inner, 5.0, n)
            return outer.__cuda_array_interface__

    fill.launch(config_for(n), LaunchesWhenAsked(), 3.0, n)
    torch.cuda.synchronize()
    assert inner.tolist() == [5.0] * n
    assert outer.tolist() == [3.0] * n
