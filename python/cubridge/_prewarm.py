"""``cubridge.prewarm`` and ``HotModule.prewarm``: what the C++ prewarm_plan does, from Python.

CUDA's lazy first-use costs (loading a kernel, the first launch of it on a stream) and the
Python launch path's own (the first launch with an argument type resolves how to pass it) fall on
a service's first request unless paid up front. A prewarm loads every kernel of a hot module's
serving version and runs the warm-up launches it is given, each followed by a synchronize of its
stream, and reports what every step cost.
"""

from __future__ import annotations

import time
from typing import Any

from . import _cubridge
from ._errors import PreconditionError


def _warm_up_launch(item: tuple) -> dict[str, Any]:
    if len(item) < 2 or not isinstance(item[1], _cubridge.LaunchConfig):
        raise PreconditionError("a warm-up launch is a tuple (kernel, LaunchConfig, *args); got "
                                f"a tuple of {len(item)} starting with {type(item[0]).__name__}")
    kernel, config, *args = item
    start = time.perf_counter()
    kernel.launch(config, *args)
    _cubridge._synchronize_stream(config.stream)
    took = (time.perf_counter() - start) * 1e3
    return {"what": f"warm-up launch of '{kernel.name}'", "milliseconds": took,
            "already_done": False}


def prewarm(*items: Any) -> list[dict[str, Any]]:
    """Pays CUDA's and cubridge's first-use costs now, in order: each item is a HotModule (its
    serving version's kernels are loaded) or a warm-up launch ``(kernel, config, *args)`` that the
    caller knows to be harmless (a scratch buffer, a count of zero), run through the same launch
    path as real launches and then synchronized. Returns one dict per step: ``what``,
    ``milliseconds``, ``already_done`` (nothing was left to do).

    >>> cubridge.prewarm(hot, (hot.get_kernel("scale"), config, scratch, 1.0, 0))
    """
    steps: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, _cubridge.HotModule):
            steps.extend(item._prewarm_load())
        elif isinstance(item, tuple):
            steps.append(_warm_up_launch(item))
        else:
            raise PreconditionError(f"cannot prewarm a {type(item).__name__}: pass a HotModule "
                                    "or a warm-up launch (kernel, LaunchConfig, *args)")
    return steps


def _hot_module_prewarm(self: Any, *launches: tuple) -> list[dict[str, Any]]:
    """Loads this module's serving kernels, then runs ``launches`` (each ``(kernel, config,
    *args)``) as warm-up launches; see cubridge.prewarm."""
    return prewarm(self, *launches)
