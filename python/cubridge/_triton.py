"""Triton kernels' calling convention, read from ``triton.compile``'s output: what cubridge
needs to load one as a hot module version and launch it. Needs neither torch nor Triton (it reads
the compiled object's attributes), so it is tested without them; cubridge.torch.TritonKernel
launches with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _cubridge
from ._errors import PreconditionError

__all__ = ["TritonSpec", "triton_image", "check_parameters"]


@dataclasses.dataclass(frozen=True)
class TritonSpec:
    """What launching a Triton kernel takes beyond its cubin, from ``triton.compile``'s metadata.

    Triton appends two pointer parameters to every kernel (global and profile scratch, 3.3 and
    later); ``launch`` passes them. ``parameters`` are the kernel's own (constexpr ones are
    compiled in and take no argument).
    """

    name: str
    parameters: tuple[str, ...]
    num_warps: int
    num_ctas: int
    shared_bytes: int
    cluster: tuple[int, int, int] | None
    global_scratch_bytes: int
    global_scratch_align: int
    profile_scratch_bytes: int
    profile_scratch_align: int

    @property
    def block(self) -> int:
        return self.num_warps * 32

    def launch_shape(self) -> tuple:
        """What a new version must keep: a captured node's block and shared memory stay as captured."""
        return (self.name, self.parameters, self.num_warps, self.num_ctas, self.shared_bytes,
                self.cluster)


def _metadata_value(metadata: Any, key: str, default: Any = None) -> Any:
    if isinstance(metadata, dict):
        return metadata.get(key, default)
    return getattr(metadata, key, default)


def triton_image(compiled: Any) -> tuple[bytes, TritonSpec]:
    """The cubin and launch spec of a Triton kernel: ``triton.compile(...)``'s result, or what
    calling a ``@triton.jit`` function returns (a ``CompiledKernel``).

    Raises PreconditionError naming what is missing (no cubin: not compiled for CUDA) or not
    supported (a cooperative grid, programmatic dependent launch).
    """
    asm = getattr(compiled, "asm", None)
    metadata = getattr(compiled, "metadata", None)
    if not isinstance(asm, dict) or metadata is None:
        raise PreconditionError(f"a {type(compiled).__name__} is no compiled Triton kernel: pass "
                                "triton.compile(...)'s result or a CompiledKernel")
    cubin = asm.get("cubin")
    if not isinstance(cubin, (bytes, bytearray)):
        raise PreconditionError(f"Triton kernel '{_metadata_value(metadata, 'name', '?')}' has no "
                                f"cubin (asm has {sorted(asm)}): compile it for a CUDA target")
    name = _metadata_value(metadata, "name")
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if _metadata_value(metadata, flag, False):
            raise PreconditionError(f"Triton kernel '{name}' asks for {flag}: cubridge launches "
                                    "plain grids only")
    src = getattr(compiled, "src", None)
    signature = getattr(src, "signature", None) or {}
    parameters = tuple(k for k, v in signature.items() if v != "constexpr")
    num_ctas = int(_metadata_value(metadata, "num_ctas", 1) or 1)
    cluster_dims = _metadata_value(metadata, "cluster_dims", None)
    cluster = None
    if num_ctas > 1:
        cluster = tuple(cluster_dims) if cluster_dims else (num_ctas, 1, 1)
    spec = TritonSpec(
        name=str(name), parameters=parameters,
        num_warps=int(_metadata_value(metadata, "num_warps")),
        num_ctas=num_ctas,
        shared_bytes=int(_metadata_value(metadata, "shared", 0) or 0),
        cluster=cluster,
        global_scratch_bytes=int(_metadata_value(metadata, "global_scratch_size", 0) or 0),
        global_scratch_align=int(_metadata_value(metadata, "global_scratch_align", 1) or 1),
        profile_scratch_bytes=int(_metadata_value(metadata, "profile_scratch_size", 0) or 0),
        profile_scratch_align=int(_metadata_value(metadata, "profile_scratch_align", 1) or 1))
    return bytes(cubin), spec


def check_parameters(cubin: bytes, spec: TritonSpec) -> None:
    """Refuses a cubin whose kernel does not take the metadata's parameters plus Triton's two
    scratch pointers (an older or newer Triton calling convention)."""
    info = _cubridge.inspect_bytes(cubin)
    kernel = next((k for k in info.kernels if k.name == spec.name), None)
    if kernel is None:
        raise PreconditionError(f"Triton kernel '{spec.name}' is not in its own cubin "
                                f"(it holds {[k.name for k in info.kernels]})")
    sizes = kernel.parameter_sizes
    if sizes is None:  # not recorded in the image: the driver checks sizes at launch
        return
    if len(sizes) != len(spec.parameters) + 2 or list(sizes[-2:]) != [8, 8]:
        raise PreconditionError(
            f"Triton kernel '{spec.name}' takes {len(sizes)} parameters in its cubin ({sizes} "
            f"B), but its metadata names {len(spec.parameters)} "
            f"({', '.join(spec.parameters)}) plus 2 scratch pointers: a calling convention "
            "cubridge does not know")
