"""Host cost per launch from Python: cubridge beside cuda.core, CuPy, Numba-CUDA and a ctypes call
of cuLaunchKernel, all in one process, on the same GPU, one stream each, interleaved rounds.

    python bench/python/bench_launch.py [--launches 5000] [--rounds 21] [--json out.json]

Each round times `launches` back-to-back launches of an empty kernel (no arguments, and with
(float*, float, int)) per method with perf_counter_ns and synchronises after; a method's figure
is the median over rounds of (time / launches). Methods run round-robin so that drift of the
machine hits all alike. Ratios are against cuda.core's launch() (issue 14's target: <= 0.8x).
Two rows explain cubridge's figure: the driver's own cost (the same launches from a C++ loop)
and the argument conversion alone (nothing launched). For three arguments, two more rows compare
like with like: cubridge given the address as an int (as cuda.core's row is), and cuda.core
reading the torch tensor's pointer at every launch (as cubridge's row does).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

import cubridge

SOURCE = r"""
__global__ void empty0() {}
__global__ void empty3(float* x, float a, int n) {}
"""
NAMES = {"empty0": "_Z6empty0v", "empty3": "_Z6empty3Pffi"}


def timed(launch, count, sync):
    launch()  # warm: first-launch costs are not what is measured
    sync()
    start = time.perf_counter_ns()
    for _ in range(count):
        launch()
    elapsed = time.perf_counter_ns() - start
    sync()
    return elapsed / count


def cubridge_methods(cubin, x):
    ctx = cubridge.PrimaryContext.adopt_runtime()
    module = cubridge.Module.load(cubin, ctx, name="bench")
    stream = cubridge.Stream(ctx)
    config = cubridge.LaunchConfig(grid=1, block=1, stream=stream)
    e0, e3 = module.get_kernel("empty0"), module.get_kernel("empty3")
    hot = cubridge.HotModule("bench", cubin, ctx)
    h0, h3 = hot.get_kernel("empty0"), hot.get_kernel("empty3")
    n = x.numel()
    sync = stream.synchronize
    yield "cubridge Kernel.launch", lambda: e0.launch(config), lambda: e3.launch(config, x, 1.0, n), sync
    # The same arguments as cuda.core's row: a precomputed address, no tensor to read.
    address = x.data_ptr()
    yield ("cubridge Kernel.launch, int address", lambda: e0.launch(config),
           lambda: e3.launch(config, address, 1.0, n), sync)
    yield "cubridge HotKernel.launch", lambda: h0.launch(config), lambda: h3.launch(config, x, 1.0, n), sync
    # The floor from Python: cuLaunchKernel through ctypes with its argument array made once.
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch_kernel = libcuda.cuLaunchKernel
    launch_kernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    values = (ctypes.c_void_p(x.data_ptr()), ctypes.c_float(1.0), ctypes.c_int(n))
    params = (ctypes.c_void_p * 3)(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    raw = stream.handle
    yield ("ctypes cuLaunchKernel",
           lambda: launch_kernel(e0.handle, 1, 1, 1, 1, 1, 1, 0, raw, None, None),
           lambda: launch_kernel(e3.handle, 1, 1, 1, 1, 1, 1, 0, raw, params, None), sync)
    yield "_keep", (module, hot, stream, values, params), None, None
    # The driver's own cost: the same launches from a C++ loop (no Python per launch).
    yield "_floor", (e0, e3, config, (x, 1.0, n)), None, None


def cuda_core_methods(cubin, x):
    try:
        try:
            from cuda.core import Device, LaunchConfig, ObjectCode, launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch
    except ImportError as error:
        print(f"cuda.core: not available ({error})")
        return
    import numpy as np
    device = Device(0)
    device.set_current()
    code = ObjectCode.from_cubin(cubin)
    k0, k3 = code.get_kernel(NAMES["empty0"]), code.get_kernel(NAMES["empty3"])
    stream = device.create_stream()
    config = LaunchConfig(grid=1, block=1)
    ptr, a, n = np.uint64(x.data_ptr()), np.float32(1.0), np.int32(x.numel())
    yield ("cuda.core launch", lambda: launch(stream, config, k0),
           lambda: launch(stream, config, k3, ptr, a, n), stream.sync)
    # What a torch user writes with cuda.core: the tensor's pointer read at every launch, as
    # cubridge reads it (the row above hands cuda.core a precomputed integer).
    yield ("cuda.core launch, data_ptr() per launch", lambda: launch(stream, config, k0),
           lambda: launch(stream, config, k3, x.data_ptr(), a, n), stream.sync)


def cupy_methods(cubin_path, x):
    try:
        import cupy
    except ImportError as error:
        print(f"CuPy: not available ({error})")
        return
    module = cupy.RawModule(path=cubin_path)
    k0, k3 = module.get_function(NAMES["empty0"]), module.get_function(NAMES["empty3"])
    stream = cupy.cuda.Stream(non_blocking=True)
    array = cupy.asarray(x)
    a, n = cupy.float32(1.0), cupy.int32(x.numel())
    # CuPy launches on its current stream; entering it per launch would be counted, so the
    # whole timing loop runs inside it instead (see main()).
    yield ("CuPy RawKernel", lambda: k0((1,), (1,), ()), lambda: k3((1,), (1,), (array, a, n)),
           stream.synchronize, stream)


def numba_methods(x):
    try:
        from numba import cuda
    except ImportError as error:
        print(f"Numba-CUDA: not available ({error})")
        return
    import numpy as np

    @cuda.jit
    def empty0():
        pass

    @cuda.jit
    def empty3(x, a, n):
        pass

    stream = cuda.stream()
    array = cuda.as_cuda_array(x)
    a, n = np.float32(1.0), np.int32(x.numel())
    yield ("Numba-CUDA", lambda: empty0[1, 1, stream](), lambda: empty3[1, 1, stream](array, a, n),
           stream.synchronize)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    import torch
    x = torch.zeros(1024, device="cuda")
    device = cubridge.Device(torch.cuda.current_device())
    cubin = cubridge.compile_cuda(SOURCE, device.compute_capability, name="bench_launch.cu")
    folder = tempfile.mkdtemp()
    cubin_path = os.path.join(folder, "bench_launch.cubin")
    with open(cubin_path, "wb") as f:
        f.write(cubin)

    methods, keep, skipped, floor = {}, [], {}, None
    for entry in [*cubridge_methods(cubin, x), *cuda_core_methods(cubin, x),
                  *cupy_methods(cubin_path, x), *numba_methods(x)]:
        if entry[0] == "_keep":
            keep.append(entry[1])
            continue
        if entry[0] == "_floor":
            floor = entry[1]
            continue
        methods[entry[0]] = entry[1:]
    for name, (l0, l3, sync, *stream) in list(methods.items()):
        try:  # a library that cannot launch here is reported, not measured
            if stream:
                with stream[0]:
                    l0(), l3(), sync()
            else:
                l0(), l3(), sync()
        except Exception as error:  # noqa: BLE001 - whatever it raised is what is reported
            print(f"{name}: does not run here: {type(error).__name__}: {error}")
            skipped[name] = f"{type(error).__name__}: {error}"
            del methods[name]
    results = {name: {"empty0": [], "empty3": []} for name in methods}
    results["C++ loop of cuLaunchKernel"] = {"empty0": [], "empty3": []}
    results["cubridge argument conversion alone"] = {"empty0": [], "empty3": []}
    for _ in range(args.rounds):
        e0, e3, config, arguments = floor
        driver = results["C++ loop of cuLaunchKernel"]
        driver["empty0"].append(cubridge._cubridge._driver_launch_loop(e0, config, args.launches))
        config.stream.synchronize()
        conversion = results["cubridge argument conversion alone"]
        conversion["empty0"].append(cubridge._cubridge._conversion_loop(e0, config, args.launches))
        conversion["empty3"].append(
            cubridge._cubridge._conversion_loop(e3, config, args.launches, *arguments))
        driver["empty3"].append(
            cubridge._cubridge._driver_launch_loop(e3, config, args.launches, *arguments))
        config.stream.synchronize()
        for name, (l0, l3, sync, *stream) in methods.items():
            for kind, launch in (("empty0", l0), ("empty3", l3)):
                if stream:  # CuPy: the loop runs with its stream current
                    with stream[0]:
                        value = timed(launch, args.launches, sync)
                else:
                    value = timed(launch, args.launches, sync)
                results[name][kind].append(value)

    report = {"python": sys.version.split()[0], "device": device.name, "torch": torch.__version__,
              "launches": args.launches, "rounds": args.rounds, "methods": {},
              "not_run": skipped}
    base = results.get("cuda.core launch")
    print(f"{'method':40} {'empty0 ns':>10} {'vs core':>8} {'empty3 ns':>10} {'vs core':>8}")
    for name, r in results.items():
        m0, m3 = statistics.median(r["empty0"]), statistics.median(r["empty3"])
        row = {"empty0_ns": m0, "empty3_ns": m3,
               "empty0_spread_ns": [min(r["empty0"]), max(r["empty0"])],
               "empty3_spread_ns": [min(r["empty3"]), max(r["empty3"])]}
        if base:
            row["empty0_vs_cuda_core"] = m0 / statistics.median(base["empty0"])
            row["empty3_vs_cuda_core"] = m3 / statistics.median(base["empty3"])
        report["methods"][name] = row
        ratio0 = f"{row.get('empty0_vs_cuda_core', float('nan')):8.3f}"
        ratio3 = f"{row.get('empty3_vs_cuda_core', float('nan')):8.3f}"
        print(f"{name:40} {m0:10.0f} {ratio0} {m3:10.0f} {ratio3}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
