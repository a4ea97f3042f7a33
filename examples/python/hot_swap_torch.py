"""A torch loop calling a hot kernel on its tensors, with v2 swapped in mid-run from CUDA C++.

    python examples/python/hot_swap_torch.py [--steps 2000] [--swap-at 1000]

The loop runs an activation written in CUDA C++ (v1: ReLU) on torch tensors, on torch's current
stream, and checks every output against torch's own computation. Midway a second thread
compiles v2 (leaky ReLU) from source with NVRTC, stages it with a smoke test that compares it
with torch on a probe tensor, and promotes it; the loop never stops, and every launch tells
which version ran, so each output is checked against the right reference. Exit status 0 when
every output matched.
"""

from __future__ import annotations

import argparse
import sys
import threading

import torch

import cubridge

ACTIVATION = r"""
__global__ void activate(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.0f ? x[i] : SLOPE * x[i];
}
"""
SLOPES = {1: "0.0f", 2: "0.1f"}  # v1 ReLU, v2 leaky ReLU


def reference(version: int, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) if version == 1 else torch.nn.functional.leaky_relu(x, 0.1)


def source_of(version: int) -> str:
    return f"#define SLOPE {SLOPES[version]}\n{ACTIVATION}"


def swap_in_v2(hot: cubridge.HotModule, arch: str, done: threading.Event) -> None:
    """What an operator's deploy does: compile, stage with a smoke test, promote."""
    cubin = cubridge.compile_cuda(source_of(2), arch, name="activate_v2.cu")

    def smoke_test(staged: cubridge.StagedModule) -> None:
        probe = torch.linspace(-4, 4, 1024, device="cuda")
        out = torch.empty_like(probe)
        staged.get_kernel("activate").launch(cubridge.LaunchConfig(grid=4, block=256),
                                             out, probe, probe.numel())
        torch.cuda.synchronize()
        torch.testing.assert_close(out, reference(2, probe))

    hot.promote(hot.stage(cubin, smoke_test=smoke_test, source_name="activate_v2.cu"))
    done.set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--swap-at", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1 << 20)
    args = parser.parse_args()

    torch.zeros(1, device="cuda")  # torch makes the device's primary context
    ctx = cubridge.PrimaryContext.adopt_runtime()  # ... and cubridge takes the same one
    arch = ctx.device.compute_capability
    hot = cubridge.HotModule("activations", cubridge.compile_cuda(source_of(1), arch), ctx)
    activate = hot.get_kernel("activate")

    n = args.size
    config = cubridge.LaunchConfig(grid=(n + 255) // 256, block=256,
                                   stream=torch.cuda.current_stream())
    per_version: dict[int, int] = {}
    mismatches = 0
    swapped, swapper = threading.Event(), None
    for step in range(args.steps):
        if step == args.swap_at:
            swapper = threading.Thread(target=swap_in_v2, args=(hot, arch, swapped))
            swapper.start()
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        version = activate.launch(config, y, x, n)
        per_version[version] = per_version.get(version, 0) + 1
        if not torch.allclose(y, reference(version, x)):
            mismatches += 1
    if swapper:
        swapper.join()
    print(f"steps: {args.steps}, launches per version: {per_version}, mismatches: {mismatches}, "
          f"v2 promoted: {swapped.is_set()}, stats: promotions={hot.stats.promotions} "
          f"rejected={hot.stats.rejected}")
    return 0 if mismatches == 0 and swapped.is_set() and len(per_version) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
