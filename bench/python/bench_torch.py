"""cubridge.torch's costs, side by side in one run on one GPU:

    python bench/python/bench_torch.py [--rounds 7] [--json out.json]

1. Dispatch: host time per call of a hot custom op (torch.library's dispatcher, the op's body,
   cubridge.torch.launch) against a direct HotKernel.launch of the same kernel with the same
   arguments (issue 36's target: at most 1 us more). Interleaved rounds of 20,000 calls; medians.
2. Retarget: CUDA graphs of 100 and 1,000 kernel nodes (torch in-place adds) with 1 and 10 hot
   nodes, captured through torch.cuda.graph. Per configuration: the promote's cost with the
   graph followed minus without (the retarget), per hot node (target: at most 50 us), against
   torch's recapture plus instantiate of the same graph (the hot nodes launched as plain
   cubridge kernels, so nothing is tracked) (target: retarget at least 100x faster); and the
   retargeted graph's outputs compared bitwise with a fresh capture's.
3. Prewarm: the first launch of a hot kernel in a fresh process, as a multiple of a steady
   launch, without and with HotModule.prewarm (target: at most 2x with it). One process per
   sample; medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import cubridge
import cubridge.torch as ct

SOURCE = r"""
extern "C" __global__ void affine(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * SCALE + OFFSET;
}
"""


def image(arch: str, scale: float, offset: float) -> bytes:
    return cubridge.compile_cuda(SOURCE, arch, options=["--fmad=false"],
                                 defines={"SCALE": f"{scale}f", "OFFSET": f"{offset}f"})


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_dispatch(hot: cubridge.HotModule, rounds: int) -> dict:
    kernel = hot.get_kernel("affine")
    n = 1024
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    config = cubridge.LaunchConfig(grid=4, block=256, stream=torch.cuda.current_stream())

    @ct.custom_op("cubridge_bench::affine_", hot, "affine", mutates_args=("y",))
    def affine_(y: torch.Tensor, x: torch.Tensor) -> None:
        ct.launch(grid=(x.numel() + 255) // 256, block=256, args=(y, x, x.numel()))

    through_ops = torch.ops.cubridge_bench.affine_
    calls = 20_000
    methods = {
        "HotKernel.launch (direct)": lambda: kernel.launch(config, y, x, n),
        "hot custom op, called": lambda: affine_(y, x),
        "hot custom op, torch.ops": lambda: through_ops(y, x),
    }
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(rounds):
        for name, call in methods.items():
            call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            samples[name].append((time.perf_counter() - start) / calls)
            torch.cuda.synchronize()
    direct = median_us(samples["HotKernel.launch (direct)"])
    rows = {name: {"us": median_us(s), "over_direct_us": median_us(s) - direct}
            for name, s in samples.items()}
    print("== dispatch: host time per call (median of %d rounds of %d calls)" % (rounds, calls))
    for name, r in rows.items():
        print(f"  {name:32s} {r['us']:7.2f} us   +{r['over_direct_us']:.2f} us over direct")
    return rows


def bench_retarget(ctx, arch: str, rounds: int) -> list[dict]:
    print("== retarget vs recapture (torch.cuda.graph; medians of %d)" % rounds)
    plain = cubridge.Module.load(image(arch, 3.0, -1.0), ctx, name="plain")
    plain_kernel = plain.get_kernel("affine")
    results = []
    for total, hot_nodes in ((100, 1), (100, 10), (1000, 1), (1000, 10)):
        hot = cubridge.HotModule(f"retarget{total}_{hot_nodes}", image(arch, 2.0, 1.0), ctx)
        v2 = image(arch, 3.0, -1.0)

        @ct.custom_op(f"cubridge_bench::affine_{total}_{hot_nodes}", hot, "affine")
        def op(x: torch.Tensor) -> torch.Tensor:
            y = torch.empty_like(x)
            ct.launch(grid=(x.numel() + 255) // 256, block=256, args=(y, x, x.numel()))
            return y

        n = 4096
        x = torch.randn(n, device="cuda")
        step = total // hot_nodes
        hot_at = set(range(step // 2, total - 1, step))

        def body(launch_hot):
            buf = x.clone()
            outs = []
            for i in range(total - 1):  # clone() above is one kernel node too
                if i in hot_at:
                    outs.append(launch_hot(buf))
                else:
                    buf.add_(1.0)
            return buf, outs

        def plain_launch(buf):
            y = torch.empty_like(buf)
            plain_kernel.launch(cubridge.LaunchConfig(grid=(n + 255) // 256, block=256,
                                                      stream=torch.cuda.current_stream()),
                                y, buf, n)
            return y

        def capture(launch_hot):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = body(launch_hot)
            return graph, outputs

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            body(op), body(plain_launch)  # warm-up
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

        graph, (buf, outs) = capture(op)
        graph.replay()
        [followed] = hot.graphs
        nodes = followed["nodes"]
        # A promote of a staged v2 and a rollback to v1, each timed, with the graph followed
        # and (same module, graph untracked for the while) without: the difference is the
        # retarget. Staging is not timed.
        with_graph, without_graph = [], []
        for _ in range(rounds):
            for followed_now in (True, False):
                if not followed_now:
                    hot.untrack_graph(followed["exec"])
                staged = hot.stage(v2)
                start = time.perf_counter()
                hot.promote(staged)
                middle = time.perf_counter()
                hot.rollback()
                end = time.perf_counter()
                (with_graph if followed_now else without_graph).extend([middle - start,
                                                                       end - middle])
                if not followed_now:
                    hot.track_graph(graph.raw_cuda_graph(), followed["exec"], "bench")
            hot.reclaim()
        # Serving v1 again; torch's recapture of the same graph, with plain kernels.
        recapture = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            start = time.perf_counter()
            g2, _ = capture(plain_launch)
            torch.cuda.synchronize()
            recapture.append(time.perf_counter() - start)
            del g2
        # Bit-identical: the retargeted graph's outputs against a fresh capture's on v2.
        hot.promote(hot.stage(v2))
        graph.replay()
        torch.cuda.synchronize()
        retargeted = [o.clone() for o in outs] + [buf.clone()]
        fresh_graph, (fresh_buf, fresh_outs) = capture(op)
        fresh_graph.replay()
        torch.cuda.synchronize()
        identical = all(torch.equal(a, b) for a, b in zip(retargeted, fresh_outs + [fresh_buf]))
        retarget_us = median_us(with_graph) - median_us(without_graph)
        row = {
            "kernel_nodes": total, "hot_nodes": hot_nodes, "followed_nodes": nodes,
            "switch_with_graph_us": median_us(with_graph),
            "switch_without_graph_us": median_us(without_graph),
            "retarget_us": retarget_us, "retarget_per_node_us": retarget_us / hot_nodes,
            "recapture_instantiate_us": median_us(recapture),
            "speedup": median_us(recapture) / max(median_us(with_graph), 1e-9),
            "bit_identical": identical,
        }
        results.append(row)
        print(f"  {total:5d} nodes, {hot_nodes:2d} hot: switch {row['switch_with_graph_us']:8.1f} us "
              f"(without graph {row['switch_without_graph_us']:6.1f}; retarget "
              f"{row['retarget_per_node_us']:6.2f} us/node) | recapture+instantiate "
              f"{row['recapture_instantiate_us']:9.1f} us | {row['speedup']:7.1f}x | "
              f"bit-identical {identical}")
        del graph, fresh_graph, op
    return results


FIRST_LAUNCH = r"""
import sys, time, json, torch, cubridge
prewarm = sys.argv[1] == "1"
torch.zeros(1, device="cuda")
ctx = cubridge.PrimaryContext.adopt_runtime()
src = open(sys.argv[2], "rb").read()
hot = cubridge.HotModule("first", src, ctx)
k = hot.get_kernel("affine")
n = 4096
x = torch.randn(n, device="cuda"); y = torch.empty_like(x)
config = cubridge.LaunchConfig(grid=16, block=256, stream=torch.cuda.current_stream())
if prewarm:
    hot.prewarm((k, config, y, x, 0))
torch.cuda.synchronize()
t = time.perf_counter(); k.launch(config, y, x, n); first = time.perf_counter() - t
torch.cuda.synchronize()
steady = []
for _ in range(2000):
    t = time.perf_counter(); k.launch(config, y, x, n); steady.append(time.perf_counter() - t)
torch.cuda.synchronize()
steady.sort()
print(json.dumps({"first_us": first * 1e6, "steady_us": steady[len(steady) // 2] * 1e6}))
"""


def bench_prewarm(arch: str, samples: int) -> dict:
    print("== first launch in a fresh process (median of %d processes each)" % samples)
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(image(arch, 2.0, 1.0))
        path = f.name
    out = {}
    try:
        for prewarm in ("0", "1"):
            ratios, firsts, steadies = [], [], []
            for _ in range(samples):
                run = subprocess.run([sys.executable, "-c", FIRST_LAUNCH, prewarm, path],
                                     capture_output=True, text=True, check=True)
                r = json.loads(run.stdout.strip().splitlines()[-1])
                firsts.append(r["first_us"])
                steadies.append(r["steady_us"])
                ratios.append(r["first_us"] / r["steady_us"])
            label = "with HotModule.prewarm" if prewarm == "1" else "without prewarm"
            out[label] = {"first_us": statistics.median(firsts),
                          "steady_us": statistics.median(steadies),
                          "ratio": statistics.median(ratios)}
            print(f"  {label:24s} first {out[label]['first_us']:8.1f} us, steady "
                  f"{out[label]['steady_us']:5.2f} us: {out[label]['ratio']:6.2f}x")
    finally:
        os.unlink(path)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.zeros(1, device="cuda")
    ctx = cubridge.PrimaryContext.adopt_runtime()
    arch = ctx.device.compute_capability
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, cubridge "
          f"{cubridge.__version__}")
    hot = cubridge.HotModule("dispatch", image(arch, 2.0, 1.0), ctx)
    figures = {"dispatch": bench_dispatch(hot, args.rounds),
               "retarget": bench_retarget(ctx, arch, args.rounds),
               "prewarm": bench_prewarm(arch, args.samples)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
