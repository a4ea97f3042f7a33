"""A small model served in a CUDA graph under torch.compile(mode="reduce-overhead"), whose
activation is a hot custom op, hot-swapped from CUDA C++ while it serves.

    python examples/python/torch_compile_hot_op.py [--requests 3000] [--swap-at 1000]

The model is three linear layers with a cubridge.torch custom op between them (v1: ReLU). The
main thread serves requests through the compiled model, whose graph torch captured once. At
request `--swap-at` a second thread compiles v2 (leaky ReLU) with NVRTC, stages it and promotes
it: the captured graph's two activation nodes are retargeted in place (no recapture) and the next
replay runs v2. Every answer is compared with an eager torch reference of the version that served
it (either side of the switch while it happens). Reports requests, mismatches, the stage and
promote (retarget) times, and latency p50/p99 before, during and after the swap. Exit status 0
when no answer mismatched.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import torch

import cubridge
import cubridge.torch as ct

ACTIVATION = r"""
extern "C" __global__ void activate(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.0f ? x[i] : SLOPE * x[i];
}
"""
SLOPES = {1: 0.0, 2: 0.1}  # v1 ReLU, v2 leaky ReLU


def cubin(version: int, arch: str) -> bytes:
    return cubridge.compile_cuda(ACTIVATION, arch, name=f"activate_v{version}.cu",
                                 defines={"SLOPE": f"{SLOPES[version]}f"})


class Model(torch.nn.Module):
    def __init__(self, width: int, act) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(3))
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.layers[0](x))
        x = self.act(self.layers[1](x))
        return self.layers[2](x)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--swap-at", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.zeros(1, device="cuda")
    ctx = cubridge.PrimaryContext.adopt_runtime()  # torch's context
    arch = ctx.device.compute_capability
    hot = cubridge.HotModule("activations", cubin(1, arch), ctx)

    @ct.custom_op("example::activate", hot, "activate")
    def activate(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        ct.launch(grid=(x.numel() + 255) // 256, block=256, args=(y, x, x.numel()))
        return y

    model = Model(args.width, activate).cuda().eval()
    references = {v: Model(args.width, lambda x, s=SLOPES[v]: torch.where(x > 0, x, s * x))
                  for v in SLOPES}
    for reference in references.values():
        reference.load_state_dict(model.state_dict())
        reference.cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)

    swap: dict[str, float] = {}

    def swap_in_v2() -> None:
        swap["start"] = time.perf_counter()
        staged = hot.stage(cubin(2, arch), source_name="activate_v2.cu")
        swap["staged"] = time.perf_counter()
        hot.promote(staged)  # retargets the captured graph's activation nodes
        swap["end"] = time.perf_counter()

    def serving_version() -> int:
        return hot.stats.current_id

    inputs = torch.randn(16, args.batch, args.width, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # torch.compile: warm-up and capture before serving
            compiled(inputs[0])
        torch.cuda.synchronize()
        latencies: list[tuple[float, float]] = []  # (start, seconds)
        mismatches, per_version = 0, {1: 0, 2: 0}
        swapper = None
        for i in range(args.requests):
            if i == args.swap_at:
                swapper = threading.Thread(target=swap_in_v2)
                swapper.start()
            x = inputs[i % len(inputs)]
            before = serving_version()
            start = time.perf_counter()
            out = compiled(x).clone()
            torch.cuda.synchronize()
            latencies.append((start, time.perf_counter() - start))
            after = serving_version()
            matched = [v for v in {before, after}
                       if torch.allclose(out, references[v](x), rtol=1e-4, atol=1e-4)]
            if matched:
                per_version[matched[0]] += 1
            else:
                mismatches += 1
        if swapper is not None:
            swapper.join()

    def window(lo: float, hi: float) -> list[float]:
        return [s for t, s in latencies if lo <= t < hi]

    phases = {"before": window(0, swap.get("start", float("inf"))),
              "during": window(swap.get("start", 0), swap.get("end", 0)),
              "after": window(swap.get("end", float("inf")), float("inf"))}
    report = {
        "gpu": torch.cuda.get_device_name(),
        "requests": args.requests,
        "mismatches": mismatches,
        "answers_per_version": per_version,
        "graphs_followed": len(hot.graphs),
        "stage_ms": (swap["staged"] - swap["start"]) * 1e3 if swap else None,
        "promote_with_retarget_ms": (swap["end"] - swap["staged"]) * 1e3 if swap else None,
        "latency_ms": {name: {"requests": len(v), "p50": percentile(v, 0.5) * 1e3,
                              "p99": percentile(v, 0.99) * 1e3} for name, v in phases.items()},
    }
    print(f"requests {report['requests']}, mismatches {mismatches}, answers per version "
          f"{per_version}, graphs followed {report['graphs_followed']}")
    if swap:
        print(f"stage {report['stage_ms']:.2f} ms, promote (retargets the graph) "
              f"{report['promote_with_retarget_ms']:.3f} ms")
    for name, figures in report["latency_ms"].items():
        print(f"  {name:6s} {figures['requests']:6d} requests  p50 {figures['p50']:.3f} ms  "
              f"p99 {figures['p99']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if mismatches == 0 and per_version[2] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
