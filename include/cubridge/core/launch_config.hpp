#pragma once
// Where and how wide a kernel launch is.

#include <cubridge/core/stream_ref.hpp>

#include <string>

namespace cubridge {

/// Grid, block or cluster extent.
struct dims {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
  [[nodiscard]] constexpr unsigned long long volume() const noexcept {
    return static_cast<unsigned long long>(x) * y * z;
  }
  friend constexpr bool operator==(const dims&, const dims&) = default;
};

/// Everything about a launch but the kernel and its arguments.
struct launch_config {
  dims grid{};
  dims block{};
  unsigned dynamic_shared_bytes = 0;
  /// Where it runs. No default (a launch_config without it does not compile): a launch that
  /// means the legacy default stream says so, `.stream = stream_ref::legacy_default()`.
  stream_ref stream;
  /// Thread-block cluster extent; {0,0,0} means no cluster (a plain cuLaunchKernel).
  dims cluster{0, 0, 0};

  /// "grid (4,1,1) block (256,1,1) shared 0 B on stream 0x0" ("... on a moved-from stream").
  [[nodiscard]] std::string describe() const;
};

namespace detail {
/// Copies grid, block and dynamic shared memory into a driver struct that spells them the
/// driver's way (CUlaunchConfig, CUDA_KERNEL_NODE_PARAMS: gridDimX ... sharedMemBytes).
template <class DriverParams>
void set_launch_shape(DriverParams& p, const launch_config& c) noexcept {
  p.gridDimX = c.grid.x;
  p.gridDimY = c.grid.y;
  p.gridDimZ = c.grid.z;
  p.blockDimX = c.block.x;
  p.blockDimY = c.block.y;
  p.blockDimZ = c.block.z;
  p.sharedMemBytes = c.dynamic_shared_bytes;
}
}  // namespace detail

}  // namespace cubridge
