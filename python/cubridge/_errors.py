"""cubridge's exceptions: one class per kind of failure, all carrying the C++ error's fields."""

from __future__ import annotations


class Error(Exception):
    """A failure cubridge reported, with the fields of the C++ ``cubridge::error``.

    Attributes:
        code: the raw code (a CUresult, cudaError_t, nvrtcResult, nvJitLinkResult or a layer's
            own code).
        name: the code's symbolic name, e.g. ``"CUDA_ERROR_INVALID_HANDLE"``,
            ``"CUBRIDGE_BAD_IMAGE"``.
        description: the library's description of the code.
        call: the call that failed, e.g. ``"cuModuleLoadDataEx"``.
        involved: what was involved (module, kernel, context, device, parameter, file).
        source: which library reported it: ``"driver"``, ``"runtime"``, ``"nvrtc"``,
            ``"nvjitlink"`` or ``"cubridge"``.
        layer: for ``source == "cubridge"``, the layer whose code it is (``"core"``,
            ``"swap"``, ``"update"``, ...); otherwise None.
        where: the C++ source file and line that raised it.
    """

    def __init__(self, message: str, *, code: int = 0, name: str = "", description: str = "",
                 call: str = "", involved: str = "", source: str = "cubridge",
                 layer: str | None = None, where: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.description = description
        self.call = call
        self.involved = involved
        self.source = source
        self.layer = layer
        self.where = where


class DriverUnavailable(Error):
    """No usable CUDA driver: libcuda.so.1 is missing or lacks an entry point."""


class ImageError(Error):
    """Bytes that are not a valid GPU image, or an image with no code for the device."""


class LaunchArgumentError(Error, TypeError):
    """Launch arguments that do not match the kernel's parameter list."""


class ContextResetError(Error):
    """A context was destroyed or reset by someone else (e.g. ``cudaDeviceReset``)."""


class VersionRejected(Error):
    """A staged module version failed validation; the serving version serves on."""


class ProbationError(VersionRejected):
    """A staged version failed its probation (:class:`cubridge.ProbationPolicy`): nothing was
    promoted and the serving version serves on. The message names the verdict and says why.

    Attributes:
        verdict: ``"faulted_in_probation"`` (the candidate faulted, or ran past run_timeout_s,
            in the sandbox worker), ``"mismatch_in_probation"`` (its outputs differed from the
            serving version's) or ``"probation_incomplete"`` (fewer launches than
            required_launches could be mirrored and passed before deadline_s).
        kernel: the kernel that faulted or differed ('' otherwise).
        launch: the mirrored launch that failed, counted from 1 (0 when none did).
        parameter: for a mismatch, the index of the pointer parameter whose allocation differed.
        offset: for a mismatch, the first differing byte offset in that allocation.
        passed: mirrored launches that matched.
        not_mirrorable: sampled launches that could not be mirrored (over max_snapshot_bytes,
            a kernel declared never_mirror, a cluster launch, ...).
    """

    def __init__(self, message: str, *, verdict: str = "", kernel: str = "", launch: int = 0,
                 parameter: int = 0, offset: int = 0, passed: int = 0, not_mirrorable: int = 0,
                 **fields) -> None:
        super().__init__(message, **fields)
        self.verdict = verdict
        self.kernel = kernel
        self.launch = launch
        self.parameter = parameter
        self.offset = offset
        self.passed = passed
        self.not_mirrorable = not_mirrorable


class PreconditionError(Error, ValueError):
    """A documented precondition was broken (a bad argument)."""


class IOFailure(Error, OSError):
    """Reading or writing a file failed."""


class CompileError(Error):
    """NVRTC or nvJitLink refused a source.

    Attributes:
        source_name: the name of the source that failed.
        architecture: the architecture it was compiled for.
        log: the compiler's log.
    """

    def __init__(self, message: str, *, source_name: str = "", architecture: str = "",
                 log: str = "", **fields) -> None:
        super().__init__(message, **fields)
        self.source_name = source_name
        self.architecture = architecture
        self.log = log


class BundleError(Error):
    """A signed bundle, manifest or key was refused.

    Attributes:
        reason: which check failed: ``"too_large"``, ``"bad_magic"``, ``"bad_signature"``,
            ``"payload_mismatch"``, ``"unknown_key"``, ``"expired"``, ``"bad_key"``, ...
    """

    def __init__(self, message: str, *, reason: str = "", **fields) -> None:
        super().__init__(message, **fields)
        self.reason = reason


class GuestError(Error):
    """A call inside a :class:`cubridge.GuestContext` broke the host's state.

    The caller's context stack was restored before this was raised.

    Attributes:
        findings: what broke, as a list of ``(what, detail)``; ``what`` is
            ``"context_stack"`` (repaired), ``"primary_context_reset"``, ``"host_buffer_lost"``
            or ``"sticky_error"`` (the process is poisoned).
        guest: the guest context's name.
    """

    def __init__(self, message: str, *, findings: list[tuple[str, str]] | None = None,
                 guest: str = "", **fields) -> None:
        super().__init__(message, **fields)
        self.findings = list(findings or [])
        self.guest = guest

    def broke(self, what: str) -> bool:
        """True if one of the findings is ``what`` (e.g. ``"primary_context_reset"``)."""
        return any(found == what for found, _ in self.findings)


class SandboxError(Error):
    """A sandboxed call or the sandbox's worker process failed; the host is untouched.

    Attributes:
        reason: ``"crashed"``, ``"aborted"``, ``"timed_out"``, ``"cuda_fault"``,
            ``"device_reset"`` (the library reset the worker's device), ``"protocol"``,
            ``"start_failed"``, ``"no_such_entry"`` or ``"buffer_import_failed"``.
        recovery: ``"spare_promoted"`` (a ready spare took the failed worker's place: the next
            call is served at once), ``"restarted"`` (a fresh worker was started before this
            raised) or ``"none"``.
        restarted: True when a worker is in place again (either recovery).
        restart_ms: from the failure being seen to a worker being in place, in milliseconds
            (0.0 when there was none).
    """

    def __init__(self, message: str, *, reason: str = "", recovery: str = "none",
                 restarted: bool = False, restart_ms: float = 0.0, **fields) -> None:
        super().__init__(message, **fields)
        self.reason = reason
        self.recovery = recovery
        self.restarted = restarted
        self.restart_ms = restart_ms


class FleetError(Error):
    """The fleet's bus or control state refused a call (:class:`cubridge.FleetController`).

    Attributes:
        reason: ``"unreachable"`` (no server answered), ``"refused"`` (the server refused this
            identity), ``"nats_failed"``, ``"config_mismatch"``, ``"oversized"`` (a bundle over
            the server's largest message), ``"conflict"`` (another writer changed the desired
            state first), ``"older_version"`` (a lower version outside a rollback) or
            ``"invalid_state"`` (nothing to resume or abort; a record that does not verify).
    """

    def __init__(self, message: str, *, reason: str = "", **fields) -> None:
        super().__init__(message, **fields)
        self.reason = reason


def _make(class_name: str, message: str, fields: dict) -> Error:
    """The exception the extension raises for a C++ error (called from C++ only)."""
    return globals()[class_name](message, **fields)


__all__ = ["Error", "DriverUnavailable", "ImageError", "LaunchArgumentError", "ContextResetError",
           "VersionRejected", "ProbationError", "PreconditionError", "IOFailure", "CompileError", "BundleError",
           "GuestError", "SandboxError"]
