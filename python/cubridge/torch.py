"""PyTorch-native hot kernels: custom ops that launch a hot module's serving version, CUDA graphs
that follow its promotes, and Triton kernels as hot versions.

    >>> import cubridge, cubridge.torch
    >>> ctx = cubridge.PrimaryContext.adopt_runtime()         # torch's context
    >>> hot = cubridge.HotModule("act", cubin_v1, ctx)
    >>> @cubridge.torch.custom_op("demo::act", hot, "activate")
    ... def act(x: torch.Tensor) -> torch.Tensor:
    ...     y = torch.empty_like(x)
    ...     cubridge.torch.launch(grid=(x.numel() + 255) // 256, block=256,
    ...                           args=(y, x, x.numel()))
    ...     return y
    >>> torch.ops.demo.act(x)                     # eager, torch.cuda.graph, torch.compile
    >>> hot.promote(hot.stage(cubin_v2))          # captured graphs now replay v2

The op's body is torch code that allocates its outputs and calls :func:`launch`; it runs as the
op's CUDA implementation (launching on torch's current stream, arguments checked as
``Kernel.launch`` checks them) and as its fake implementation (shapes only: ``launch`` does
nothing), so the op works in eager mode, under ``torch.cuda.graph`` capture and under
``torch.compile`` (``fullgraph=True``, ``mode="reduce-overhead"``).

CUDA graphs follow promotes. A launch under stream capture adds a kernel node cubridge remembers
(``HotKernel.capture``); when the capture ends the graph is instantiated and tracked by the hot
module, which points its nodes at the serving version on every promote and rollback
(``cuGraphExecKernelNodeSetParams``: no recapture, no re-instantiation). For that, cubridge
wraps methods of ``torch.cuda.CUDAGraph`` once a hot op exists (or :func:`follow_graphs` is
called): new graphs keep their ``cudaGraph_t`` (``keep_graph=True`` becomes ``__init__``'s
default, and they are instantiated at ``capture_end`` as torch's default does), ``capture_end``
tracks, ``replay`` holds the graph against a concurrent switch (a replay never runs a mix of
versions, and the version it ran stays loaded until its work completed), ``instantiate``
re-tracks the new executable graph and ``reset`` untracks.
"""

from __future__ import annotations

import contextlib
import inspect as _inspect
import threading
import typing
import weakref
from typing import Any, Callable, Iterable, Sequence

try:
    import torch
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("cubridge.torch needs PyTorch (pip install torch); the rest of cubridge "
                      "works without it") from e

from . import _cubridge
from ._errors import LaunchArgumentError, PreconditionError
from ._triton import TritonSpec, check_parameters, triton_image

# Registered ops live as long as torch.library's registry, the process: not a leak to report.
_cubridge._set_leak_warnings(False)

__all__ = ["custom_op", "launch", "HotOp", "follow_graphs", "graph_versions", "TritonKernel",
           "triton_image", "TritonSpec"]


# -- Triton ---------------------------------------------------------------------------------------

class TritonKernel:
    """A Triton kernel as a hot module: its first version loads from ``triton.compile``'s
    output; :meth:`stage` takes later versions (same kernel name, parameters and launch shape:
    a graph's captured nodes keep their block and shared memory), and the hot module's
    promote, rollback, probation and graph following all apply.

    >>> k = cubridge.torch.TritonKernel("add", add_kernel[(1,)](x, y, out, n, BLOCK=256), ctx)
    >>> k.launch(grid, x, y, out, n)          # scratch arguments added, block from num_warps
    >>> k.hot.promote(k.stage(add_kernel_v2_compiled))
    """

    def __init__(self, name: str, compiled: Any, context: Any = None) -> None:
        cubin, spec = triton_image(compiled)
        if spec.shared_bytes > 48 * 1024:
            raise PreconditionError(
                f"Triton kernel '{spec.name}' needs {spec.shared_bytes} B of dynamic shared "
                "memory: over 48 KiB needs a per-version function attribute cubridge does not "
                "set yet")
        self.spec = spec
        check_parameters(cubin, spec)
        self.hot = _cubridge.HotModule(name, cubin, context)
        self.kernel = self.hot.get_kernel(spec.name)

    def stage(self, compiled: Any, **options: Any) -> Any:
        """Stages another compile of the kernel (``HotModule.stage``'s options apply); raises
        PreconditionError if its name, parameters or launch shape differ from the first's."""
        cubin, spec = triton_image(compiled)
        check_parameters(cubin, spec)
        if spec.launch_shape() != self.spec.launch_shape():
            raise PreconditionError(
                f"Triton kernel '{spec.name}': a new version must keep the launch shape "
                f"(name, parameters, num_warps, num_ctas, shared, cluster) {self.spec.launch_shape()}; "
                f"this one has {spec.launch_shape()}")
        return self.hot.stage(cubin, **options)

    def config(self, grid: Any, stream: Any = None) -> Any:
        return _cubridge.LaunchConfig(grid=grid, block=self.spec.block,
                                      shared_mem=self.spec.shared_bytes, stream=stream,
                                      cluster=self.spec.cluster)

    def arguments(self, grid: Any, args: Sequence[Any], stream: Any = None) -> tuple:
        """``args`` with Triton's two scratch pointers appended: null when the kernel asks for no
        scratch, else a torch buffer of size x programs x CTAs (torch's allocations are 512-byte
        aligned, more than Triton asks), kept for ``stream``'s work (record_stream)."""
        if len(args) != len(self.spec.parameters):
            raise LaunchArgumentError(
                f"Triton kernel '{self.spec.name}' takes {len(self.spec.parameters)} arguments "
                f"({', '.join(self.spec.parameters)}), got {len(args)}")
        programs = 1
        for d in (grid if isinstance(grid, (tuple, list)) else (grid,)):
            programs *= int(d)
        scratch: list[Any] = []
        for size, align in ((self.spec.global_scratch_bytes, self.spec.global_scratch_align),
                            (self.spec.profile_scratch_bytes, self.spec.profile_scratch_align)):
            if size == 0:
                scratch.append(0)
                continue
            if align > 512:
                raise PreconditionError(f"Triton kernel '{self.spec.name}' asks for scratch "
                                        f"aligned to {align} B; torch's allocations give 512")
            buffer = torch.empty(size * programs * self.spec.num_ctas, dtype=torch.uint8,
                                 device="cuda")
            if isinstance(stream, torch.cuda.Stream):
                buffer.record_stream(stream)  # freed for reuse only after that stream's work
            scratch.append(buffer)
        return (*args, *scratch)

    def launch(self, grid: Any, *args: Any, stream: Any = None) -> int:
        """Launches the serving version on ``stream`` (default: torch's current stream), or
        captures it when that stream is capturing. Returns the version's id."""
        stream = torch.cuda.current_stream() if stream is None else stream
        config = self.config(grid, stream)
        full = self.arguments(grid, args, stream)
        return _launch_or_capture(self.hot, self.kernel, config, full)


# -- custom ops -----------------------------------------------------------------------------------

_state = threading.local()  # .op: the HotOp whose body runs; .fake: its fake implementation runs


def _prototype(body: Callable[..., Any]) -> Callable[..., Any]:
    """A function with `body`'s signature, its annotations resolved (a module with `from
    __future__ import annotations` holds them as strings), for torch.library.infer_schema."""
    hints = {name: None if hint is type(None) else hint  # torch spells "returns nothing" None
             for name, hint in typing.get_type_hints(body).items()}
    signature = _inspect.signature(body)
    signature = signature.replace(
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation))
                    for p in signature.parameters.values()],
        return_annotation=hints.get("return", signature.return_annotation))

    def prototype(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("never called")

    prototype.__signature__ = signature  # type: ignore[attr-defined]
    prototype.__annotations__ = hints
    prototype.__name__ = body.__name__
    return prototype


# The current stream's handle and capture state, without making a torch.cuda.Stream per call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                        torch.cuda.is_current_stream_capturing)


def _current_stream() -> int:
    if _raw_stream is not None:
        return _raw_stream(_current_device())
    return torch.cuda.current_stream().cuda_stream


class HotOp:
    """A ``torch.library`` custom op launching a hot module's kernel (made by :func:`custom_op`).

    Call it as a function or through ``torch.ops.<ns>.<name>``; keep it alive as long as the op
    is used (its torch.library registration goes with it). ``last_version`` is the id of the
    version the last eager launch (or capture) on this thread ran; graphs report theirs through
    :func:`graph_versions`.
    """

    def __init__(self, qualname: str, hot: Any, kernel: Any, body: Callable[..., Any],
                 mutates_args: Iterable[str] | str, schema: str | None) -> None:
        self.qualname = qualname
        self.hot = hot.hot if isinstance(hot, TritonKernel) else hot
        self._triton = hot if isinstance(hot, TritonKernel) else None
        self._body = body
        self._kernels: dict[str, Any] = {}
        self.kernel_name = kernel if kernel is not None else (
            self._triton.spec.name if self._triton else None)
        if self.kernel_name is None:
            raise PreconditionError(f"custom op '{qualname}': name the kernel it launches")
        self._kernel(self.kernel_name)  # a name the interface lacks is refused now
        self._versions = threading.local()
        follow_graphs()

        op = self

        def implementation(*args: Any, **kwargs: Any) -> Any:
            return op._run(False, args, kwargs)

        def fake(*args: Any, **kwargs: Any) -> Any:
            return op._run(True, args, kwargs)

        if schema is None:
            schema = torch.library.infer_schema(_prototype(body), mutates_args=mutates_args)
        namespace, _, name = qualname.partition("::")
        if not namespace or not name:
            raise PreconditionError(f"custom op '{qualname}': name it 'namespace::name'")
        # torch.library's low-level registration: the dispatcher calls the body directly for
        # CUDA tensors (torch.library.custom_op's Python wrappers cost tens of microseconds more
        # per call), and the fake implementation serves FakeTensor and meta tensors.
        self._library = torch.library.Library(namespace, "FRAGMENT")
        self._library.define(name + schema)
        self._library.impl(name, implementation, "CUDA")
        torch.library.register_fake(qualname, fake, lib=self._library)
        self.op = getattr(getattr(torch.ops, namespace), name).default
        self._configs: dict[tuple, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    @property
    def last_version(self) -> int | None:
        return getattr(self._versions, "last", None)

    def _kernel(self, name: str) -> Any:
        kernel = self._kernels.get(name)
        if kernel is None:
            kernel = self.hot.get_kernel(name)
            self._kernels[name] = kernel
        return kernel

    def _run(self, fake: bool, args: tuple, kwargs: dict) -> Any:
        outer = (getattr(_state, "op", None), getattr(_state, "fake", False))
        _state.op, _state.fake = self, fake
        try:
            return self._body(*args, **kwargs)
        finally:
            _state.op, _state.fake = outer

    def _launch(self, grid: Any, block: Any, args: Sequence[Any], shared_bytes: int,
                kernel: str | None) -> int | None:
        if self._triton is not None and (kernel is None or kernel == self._triton.spec.name):
            if getattr(_state, "fake", False):
                return None
            version = self._triton.launch(grid, *args)
        else:
            if block is None:
                raise PreconditionError(f"custom op '{self.qualname}': launch needs block= for "
                                        "a CUDA C++ kernel (a Triton kernel's comes from its "
                                        "num_warps)")
            k = self._kernel(kernel or self.kernel_name)
            if getattr(_state, "fake", False):
                return None
            key = (grid if isinstance(grid, int) else tuple(grid),
                   block if isinstance(block, int) else tuple(block), shared_bytes, _current_stream())
            config = self._configs.get(key)
            if config is None:
                if len(self._configs) >= 256:  # shapes vary: keep the cache bounded
                    self._configs.clear()
                config = _cubridge.LaunchConfig(grid=grid, block=block, shared_mem=shared_bytes,
                                                stream=key[3])
                self._configs[key] = config
            version = _launch_or_capture(self.hot, k, config, args)
        self._versions.last = version
        return version


def custom_op(qualname: str, hot: Any, kernel: str | None = None, *,
              mutates_args: Iterable[str] | str = (), schema: str | None = None
              ) -> Callable[[Callable[..., Any]], HotOp]:
    """Decorates an op's body into a :class:`HotOp`: a ``torch.library`` custom op named
    ``qualname`` ("ns::name") whose body allocates its outputs and calls :func:`launch` to run
    ``kernel`` of ``hot`` (a HotModule, or a :class:`TritonKernel` whose kernel is the default).

    The body's annotations give the op's schema (or pass ``schema``), as for
    ``torch.library.custom_op``; ``mutates_args`` names the inputs the kernel writes.
    """

    def wrap(body: Callable[..., Any]) -> HotOp:
        return HotOp(qualname, hot, kernel, body, mutates_args, schema)

    return wrap


def launch(grid: Any, block: Any = None, args: Sequence[Any] = (), *, shared_bytes: int = 0,
           kernel: str | None = None) -> int | None:
    """Inside a hot op's body: launches its kernel (or ``kernel`` of the same module) on torch's
    current stream with ``args`` (checked as Kernel.launch checks them), captured when that stream
    is capturing. Returns the id of the version that ran, None in the op's fake implementation
    (which only computes shapes). ``block`` may be left out for a Triton kernel."""
    op = getattr(_state, "op", None)
    if op is None:
        raise PreconditionError("cubridge.torch.launch is called inside the body of a "
                                "cubridge.torch.custom_op; launch a kernel elsewhere with "
                                "HotKernel.launch")
    return op._launch(grid, block, tuple(args), shared_bytes, kernel)


# -- CUDA graphs that follow promotes -------------------------------------------------------------

_capturing = threading.local()  # .modules: hot modules captured into the capture on this thread
_installed = False
_install_lock = threading.Lock()


def _launch_or_capture(hot: Any, kernel: Any, config: Any, args: Sequence[Any]) -> int:
    """Launches `kernel` of `hot` on config's stream, or, while torch's current stream is
    capturing, captures it and remembers the module for capture_end to track the graph."""
    if _is_capturing():
        _note_capturing(hot)
        return kernel.capture(config, *args)
    return kernel.launch(config, *args)


def _note_capturing(hot: Any) -> None:
    modules = getattr(_capturing, "modules", None)
    if modules is None:
        modules = _capturing.modules = {}
    modules[id(hot)] = hot


def _take_capturing() -> list:
    modules = getattr(_capturing, "modules", None) or {}
    _capturing.modules = {}
    # One order for every graph, so that replays nesting the modules' locks never deadlock.
    return sorted(modules.values(), key=id)


def _untrack(modules: list, exec_handle: int) -> None:
    for hot in modules:
        with contextlib.suppress(Exception):  # a module closed already follows nothing
            hot.untrack_graph(exec_handle)


def _graph_name(graph: Any) -> str:
    return f"torch.cuda.CUDAGraph at {id(graph):#x}"


def follow_graphs() -> None:
    """Makes torch's CUDA graphs follow the promotes of the hot kernels captured into them (done by
    the first :func:`custom_op`; idempotent). See the module's documentation for what it wraps."""
    global _installed
    with _install_lock:
        if _installed:
            return
        graph_class = torch.cuda.CUDAGraph
        base_init = graph_class.__mro__[1].__init__  # torch._C._CUDAGraph's: takes keep_graph
        original = {name: getattr(graph_class, name)
                    for name in ("capture_begin", "capture_end", "instantiate", "replay", "reset")}

        def __init__(self, keep_graph: bool | None = None) -> None:  # type: ignore[no-untyped-def]
            base_init(self, True if keep_graph is None else keep_graph)
            # Kept by cubridge's default, not asked for: instantiated at capture_end as torch does.
            self._cubridge_kept = keep_graph is None

        def capture_begin(self, *args: Any, **kwargs: Any) -> None:
            _take_capturing()  # what an abandoned capture left on this thread
            original["capture_begin"](self, *args, **kwargs)

        def capture_end(self) -> None:
            original["capture_end"](self)
            modules = _take_capturing()
            if modules:
                try:
                    self.raw_cuda_graph()
                except RuntimeError as e:
                    names = ", ".join(f"'{m.name}'" for m in modules)
                    raise PreconditionError(
                        f"{_graph_name(self)} captured hot module(s) {names} but was made with "
                        "keep_graph=False: its nodes could not follow a promote. Make it with "
                        "keep_graph=True (cubridge.torch's default)") from e
            if modules or getattr(self, "_cubridge_kept", False):
                original["instantiate"](self)  # a kept graph is not instantiated by torch
            if modules:
                _track(self, modules)

        def instantiate(self) -> None:
            follow = getattr(self, "_cubridge_follow", None)
            if follow is not None:  # a new exec replaces the one the modules follow
                _untrack(follow[1], follow[0])
                follow[2].detach()
                self._cubridge_follow = None
            original["instantiate"](self)
            if follow is not None:
                _track(self, follow[1])

        def replay(self) -> None:
            follow = getattr(self, "_cubridge_follow", None)
            if follow is None:
                return original["replay"](self)
            exec_handle, modules, _ = follow
            stream = torch.cuda.current_stream()
            run: Callable[[], Any] = lambda: original["replay"](self)
            for hot in reversed(modules):
                run = (lambda h, inner: lambda: h.launch_graph(exec_handle, stream, inner))(hot, run)
            run()

        def reset(self) -> None:
            follow = getattr(self, "_cubridge_follow", None)
            if follow is not None:
                _untrack(follow[1], follow[0])
                follow[2].detach()
                self._cubridge_follow = None
            original["reset"](self)

        graph_class.__init__ = __init__  # type: ignore[method-assign]
        for name, f in (("capture_begin", capture_begin), ("capture_end", capture_end),
                        ("instantiate", instantiate), ("replay", replay), ("reset", reset)):
            f.__doc__ = original[name].__doc__
            setattr(graph_class, name, f)
        _installed = True


def _track(graph: Any, modules: list) -> None:
    exec_handle = graph.raw_cuda_graph_exec()
    tracked = []
    try:
        for hot in modules:
            hot.track_graph(graph.raw_cuda_graph(), exec_handle, _graph_name(graph))
            tracked.append(hot)
    except BaseException:
        _untrack(tracked, exec_handle)
        raise
    # Untracked before torch destroys the exec: weakref callbacks run before the object's own
    # deallocation.
    finalizer = weakref.finalize(graph, _untrack, tracked, exec_handle)
    graph._cubridge_follow = (exec_handle, tracked, finalizer)


def graph_versions(graph: Any) -> dict[str, int]:
    """For a ``torch.cuda.CUDAGraph``: the version each hot module's nodes in it launch
    ({module name: version id}); empty for a graph with no hot kernel."""
    follow = getattr(graph, "_cubridge_follow", None)
    if follow is None:
        return {}
    exec_handle, modules, _ = follow
    out = {}
    for hot in modules:
        for g in hot.graphs:
            if g["exec"] == exec_handle:
                out[hot.name] = g["version"]
    return out
