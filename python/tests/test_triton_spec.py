"""Without a GPU, torch or Triton: reading a Triton kernel's calling convention from what
triton.compile returns (its cubin and metadata), and refusing what cubridge cannot launch. The
cubins are compiled here with NVRTC in Triton's convention: the kernel's own parameters, then
two scratch pointers."""

from __future__ import annotations

import types

import pytest

import cubridge
from cubridge._triton import TritonSpec, check_parameters, triton_image

TRITON_LIKE = r"""
extern "C" __global__ void add_kernel(const float* x, const float* y, float* out, int n,
                                      void* global_scratch, void* profile_scratch) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + y[i];
}
"""

SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
             "BLOCK": "constexpr"}


def metadata(**changes):
    # The fields of Triton 3.6's KernelMetadata that cubridge reads (a dict works as well as the
    # namedtuple).
    fields = dict(name="add_kernel", num_warps=4, num_ctas=1, shared=0, cluster_dims=None,
                  global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                  profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=False)
    fields.update(changes)
    return fields


def compiled(cubin, signature=SIGNATURE, **changes):
    return types.SimpleNamespace(asm={"ttir": "...", "ptx": "...", "cubin": cubin},
                                 metadata=types.SimpleNamespace(**metadata(**changes)),
                                 src=types.SimpleNamespace(signature=signature))


@pytest.fixture(scope="module")
def cubin():
    return cubridge.compile_cuda(TRITON_LIKE, "sm_90")


def test_the_spec_comes_from_the_metadata_and_drops_constexpr_parameters(cubin):
    image, spec = triton_image(compiled(cubin, num_warps=8, shared=1024))
    assert image == cubin
    assert spec == TritonSpec(name="add_kernel", parameters=("x_ptr", "y_ptr", "out_ptr", "n"),
                              num_warps=8, num_ctas=1, shared_bytes=1024, cluster=None,
                              global_scratch_bytes=0, global_scratch_align=1,
                              profile_scratch_bytes=0, profile_scratch_align=1)
    assert spec.block == 256
    check_parameters(image, spec)  # 4 own parameters + 2 scratch pointers: as the cubin says


def test_a_multi_cta_kernel_launches_as_a_cluster(cubin):
    _, spec = triton_image(compiled(cubin, num_ctas=2))
    assert spec.cluster == (2, 1, 1)
    _, spec = triton_image(compiled(cubin, num_ctas=4, cluster_dims=(2, 2, 1)))
    assert spec.cluster == (2, 2, 1)


def test_a_cubin_whose_parameters_disagree_with_the_metadata_is_refused(cubin):
    image, spec = triton_image(compiled(cubin, signature={"x_ptr": "*fp32", "n": "i32"}))
    with pytest.raises(cubridge.PreconditionError,
                       match=r"takes 6 parameters in its cubin .* names 2 \(x_ptr, n\) plus 2 "
                             r"scratch pointers"):
        check_parameters(image, spec)


def test_a_kernel_missing_from_its_cubin_is_refused(cubin):
    image, spec = triton_image(compiled(cubin, name="other_kernel"))
    with pytest.raises(cubridge.PreconditionError, match=r"'other_kernel' is not in its own cubin"):
        check_parameters(image, spec)


@pytest.mark.parametrize("flag", ["launch_cooperative_grid", "launch_pdl"])
def test_launch_modes_cubridge_does_not_offer_are_refused(cubin, flag):
    with pytest.raises(cubridge.PreconditionError, match=f"asks for {flag}"):
        triton_image(compiled(cubin, **{flag: True}))


def test_what_is_no_compiled_kernel_is_refused_with_what_it_is(cubin):
    with pytest.raises(cubridge.PreconditionError, match="a str is no compiled Triton kernel"):
        triton_image("add_kernel")
    no_cubin = compiled(cubin)
    del no_cubin.asm["cubin"]
    with pytest.raises(cubridge.PreconditionError,
                       match=r"'add_kernel' has no cubin \(asm has \['ptx', 'ttir'\]\)"):
        triton_image(no_cubin)


def test_cubridge_torch_says_it_needs_torch_where_torch_is_missing():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="cubridge.torch needs PyTorch"):
            import cubridge.torch  # noqa: F401
    else:
        pytest.skip("torch is installed here: the message is not reachable")
