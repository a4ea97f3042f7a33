"""cubridge for Python: CUDA contexts, run-time kernels, hot swaps and signed module bundles.

This package is a thin Python face over cubridge's C++ library (the extension module
``cubridge._cubridge``); it implements nothing twice. What runs without a GPU:

    >>> import cubridge
    >>> cubridge.doctor()["driver"]["available"]          # the report of `cubridge doctor`
    >>> info = cubridge.inspect("kernels.cubin")          # kind, targets, kernels
    >>> cubin = cubridge.compile_cuda(source, arch="sm_90")
    >>> keys = cubridge.generate_keypair()
    >>> bundle = cubridge.sign_bundle(cubin, keys.secret_key, name="filters", version=2,
    ...                               target="sm_90")
    >>> cubridge.verify_bundle(bundle, [keys.public_key]).manifest.version

With a GPU, beside torch or CuPy (which use the device's primary context):

    >>> ctx = cubridge.PrimaryContext.adopt_runtime()     # the context torch uses
    >>> mod = cubridge.Module.from_source(source, ctx)     # NVRTC, on-disk cache
    >>> scale = mod.get_kernel("scale")                    # C++ name; parameters from the driver
    >>> cfg = cubridge.LaunchConfig(grid=n // 256, block=256,
    ...                             stream=torch.cuda.current_stream())
    >>> scale.launch(cfg, x, 2.0, n)                       # x: a torch tensor; checked
    >>> hot = cubridge.HotModule("filters", cubin_v1, ctx) # hot swap
    >>> hot.promote(hot.stage(cubin_v2, smoke_test=check))
    >>> hot.prewarm((hot.get_kernel("scale"), cfg, x, 1.0, 0))  # first launch costs paid now
    >>> guest = cubridge.GuestContext(name="vendor-fft")  # third-party code in its own context
    >>> with guest:
    ...     vendor.run()                                   # GuestError for what it broke
    >>> with cubridge.Sandbox("libvendor.so") as box:      # or in a process of its own
    ...     status, reply = box.call("entry", b"request", buffers=[cubridge.SharedMemory(n)])
    >>> endpoint = cubridge.UpdateEndpoint(hot, [keys.public_key])  # signed pushes, HTTP
    >>> agent = cubridge.FleetAgent(hot, [keys.public_key], node="node-1",  # or a fleet node
    ...                             node_key_file="node-1.key", health_probe=check_answers)
    >>> cubridge.FleetController(operator_keys=[keys.public_key]).rollout_waves(
    ...     bundle, keys.secret_key, waves=["1", "50%"], bake_s=30)  # from the operator's side

Failures raise subclasses of :class:`cubridge.Error`, which carry the C++ error's fields.
"""

from __future__ import annotations

import json as _json
import os as _os
from typing import Any, Mapping, Sequence, Union

from . import _cubridge
from ._cubridge import (BundleManifest, Context, ContextRef, Device, DeviceView, GuestContext,
                        GroupKernel, HotKernel, HotModule, HotModuleGroup,
                        HotModuleStats, HotReloader, PinnedGeneration, StagedGroup, ImageInfo,
                        ImageKernel, ImageTarget, Kernel, KeyPair, LaunchConfig, Module,
                        PrimaryContext, ProbationPolicy, PublicKey, Sandbox, SecretKey,
                        SharedMemory, StagedModule, StagedVersion, Stream, UpdateEndpoint,
                        UpdateGate, VerifiedBundle, POISONED_EXIT_CODE,
                        before_stream_destroy, current_context, device_count, devices, driver_available,
                        exit_when_poisoned, generate_keypair, health, kernel_signature,
                        scoped_current, sign_bundle, unmangled_name, verify_bundle)
from ._prewarm import _hot_module_prewarm, prewarm
from ._errors import (BundleError, CompileError, ContextResetError, DriverUnavailable, Error,
                      FleetError, GuestError, ImageError, IOFailure, LaunchArgumentError, PreconditionError,
                      ProbationError, SandboxError, VersionRejected)

HotModule.prewarm = _hot_module_prewarm  # written in Python, over HotModule._prewarm_load

# The fleet's two sides, where the extension was built with the fleet layer (libnats): always in
# the wheel and in builds by scripts/setup; `has_fleet` says.
has_fleet: bool = _cubridge.has_fleet
if has_fleet:
    from ._cubridge import AgentOptions, BusOptions, FleetAgent, FleetController

# The version of the C++ library this package wraps (CMakeLists.txt's project version, the one
# place it is written; the package metadata reads it from there too).
__version__: str = _cubridge.__version__

ImageSource = Union[bytes, bytearray, memoryview, str, "_os.PathLike[str]"]


def doctor() -> dict[str, Any]:
    """What ``cubridge doctor --json`` reports: driver, runtime, devices, loading mode, JIT cache.

    Never raises for a missing driver: ``doctor()["driver"]["available"]`` is False then and
    ``doctor()["driver"]["reason"]`` says why.
    """
    return _json.loads(_cubridge.diagnose())


def inspect(image: ImageSource) -> ImageInfo:
    """What a cubin, fatbin or PTX image holds: its kind, targets and kernels with parameter sizes.

    ``image`` is the image's bytes (bytes, bytearray, memoryview) or the path of its file (str or
    os.PathLike). Needs no GPU. Raises ImageError for bytes that are no valid image and
    IOFailure for a file that cannot be read.
    """
    if isinstance(image, (bytes, bytearray, memoryview)):
        return _cubridge.inspect_bytes(bytes(image))
    return _cubridge.inspect_file(_os.fspath(image))


def compile_cuda(source: str, arch: str = "sm_90", *, name: str = "kernel.cu",
                 options: Sequence[str] = (), defines: Mapping[str, str] | None = None) -> bytes:
    """CUDA C++ ``source`` compiled by NVRTC to a cubin for ``arch`` (e.g. "sm_90", "sm_90a").

    ``name`` names the source in messages, ``options`` are further NVRTC options
    ("-std=c++20", "--use_fast_math"), ``defines`` macros ({"N": "256"}). Needs no GPU. Raises
    CompileError with the compiler's log (``.log``), PreconditionError for a bad ``arch``.
    """
    return _cubridge.compile_cuda(source, arch, name, list(options), dict(defines or {}))


__all__ = [
    "doctor", "inspect", "compile_cuda", "prewarm", "device_count", "driver_available", "generate_keypair",
    "devices", "Device", "Context", "PrimaryContext", "ContextRef", "current_context",
    "scoped_current", "Stream", "before_stream_destroy", "LaunchConfig", "Module", "Kernel", "DeviceView",
    "kernel_signature", "unmangled_name", "HotModule", "HotKernel", "HotModuleStats", "HotModuleGroup",
    "GroupKernel", "PinnedGeneration", "StagedGroup",
    "HotReloader", "StagedModule", "StagedVersion", "ProbationPolicy", "GuestContext",
    "SharedMemory", "Sandbox",
    "UpdateEndpoint", "UpdateGate", "health", "exit_when_poisoned", "POISONED_EXIT_CODE",
    "sign_bundle", "verify_bundle", "ImageInfo", "ImageTarget", "ImageKernel", "KeyPair",
    "PublicKey", "SecretKey", "BundleManifest", "VerifiedBundle", "Error", "DriverUnavailable",
    "ImageError", "LaunchArgumentError", "ContextResetError", "VersionRejected", "ProbationError",
    "PreconditionError", "IOFailure", "CompileError", "BundleError", "GuestError",
    "SandboxError", "FleetError", "has_fleet",
] + (["FleetAgent", "FleetController", "AgentOptions", "BusOptions"] if has_fleet else [])
