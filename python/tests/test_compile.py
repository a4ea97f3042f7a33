"""cubridge.compile_cuda: CUDA C++ to a cubin through NVRTC (build_machine_code), no GPU."""

import pytest

import cubridge

SOURCE = r"""
extern "C" __global__ void scale(float* data, float factor, unsigned long long n) {
  const unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor * SCALE;
}
"""


def test_compiles_a_cubin_that_inspect_reads():
    cubin = cubridge.compile_cuda(SOURCE, arch="sm_90", defines={"SCALE": "2.0f"})
    assert isinstance(cubin, bytes)
    info = cubridge.inspect(cubin)
    assert info.kind == "cubin"
    assert [t.arch for t in info.targets] == ["sm_90"]
    assert info.find_kernel("scale").parameter_sizes == [8, 4, 8]


def test_other_architecture():
    cubin = cubridge.compile_cuda(SOURCE, "sm_80", options=["-DSCALE=1.0f"])
    assert [t.arch for t in cubridge.inspect(cubin).targets] == ["sm_80"]


def test_a_syntax_error_raises_compile_error_with_the_log():
    with pytest.raises(cubridge.CompileError) as caught:
        cubridge.compile_cuda("this is not CUDA", name="broken.cu")
    e = caught.value
    assert e.source == "nvrtc"
    assert e.source_name == "broken.cu"
    assert e.architecture == "sm_90"
    assert "broken.cu" in e.log and "error" in e.log


def test_a_bad_architecture_raises_precondition_error():
    with pytest.raises(cubridge.PreconditionError) as caught:
        cubridge.compile_cuda(SOURCE, arch="compute_90")
    assert "compute_90" in str(caught.value)
    assert caught.value.name == "CUBRIDGE_PRECONDITION"
