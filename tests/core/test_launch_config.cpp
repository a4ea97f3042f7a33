#include <cubridge/core/error.hpp>
#include <cubridge/core/launch_config.hpp>

#include <gtest/gtest.h>

#include <type_traits>

namespace {

using cubridge::stream_ref;

// The stream has no default (issue 11, item 15): a launch that leaves it out does not compile,
// where it used to run on the legacy default stream without saying so.
template <class Config>
concept stream_left_out_compiles = requires {
  Config{.grid = {4}, .block = {256}};
};
template <class Config>
concept stream_named_compiles = requires(stream_ref s) {
  Config{.grid = {4}, .block = {256}, .stream = s};
};
static_assert(!stream_left_out_compiles<cubridge::launch_config>);
static_assert(stream_named_compiles<cubridge::launch_config>);
static_assert(!std::is_default_constructible_v<cubridge::launch_config>);

TEST(LaunchConfig, DefaultsAreOneThreadWithoutClusterOnTheNamedStream) {
  const cubridge::launch_config c{.stream = stream_ref::legacy_default()};
  EXPECT_EQ(c.grid, (cubridge::dims{1, 1, 1}));
  EXPECT_EQ(c.block, (cubridge::dims{1, 1, 1}));
  EXPECT_EQ(c.dynamic_shared_bytes, 0u);
  EXPECT_EQ(c.stream, stream_ref::legacy_default());
  EXPECT_EQ(c.cluster.x, 0u);
}

TEST(LaunchConfig, DimsVolumeDoesNotOverflow) {
  EXPECT_EQ((cubridge::dims{65535, 65535, 64}.volume()), 65535ull * 65535ull * 64ull);
}

TEST(LaunchConfig, DescribeNamesEveryPart) {
  cubridge::launch_config c{.grid = {4, 2},
                            .block = {256},
                            .dynamic_shared_bytes = 1024,
                            .stream = stream_ref::legacy_default()};
  EXPECT_EQ(c.describe(), "grid (4,2,1) block (256,1,1) shared 1024 B on stream 0x0");
  c.cluster = {2, 1, 1};
  EXPECT_EQ(c.describe(),
            "grid (4,2,1) block (256,1,1) shared 1024 B cluster (2,1,1) on stream 0x0");
  // What a moved-from cubridge::stream holds: described, not thrown on.
  c.stream = stream_ref::from_native(cubridge::detail::moved_from_stream());
  EXPECT_EQ(c.describe(),
            "grid (4,2,1) block (256,1,1) shared 1024 B cluster (2,1,1) on a moved-from stream");
}

TEST(LaunchConfig, ShapeGoesIntoBothDriverStructs) {
  const cubridge::launch_config c{.grid = {4, 2, 3},
                                  .block = {32, 8, 2},
                                  .dynamic_shared_bytes = 512,
                                  .stream = stream_ref::legacy_default()};
  auto expect_shape = [](const auto& p) {
    EXPECT_EQ(p.gridDimX, 4u);
    EXPECT_EQ(p.gridDimY, 2u);
    EXPECT_EQ(p.gridDimZ, 3u);
    EXPECT_EQ(p.blockDimX, 32u);
    EXPECT_EQ(p.blockDimY, 8u);
    EXPECT_EQ(p.blockDimZ, 2u);
    EXPECT_EQ(p.sharedMemBytes, 512u);
  };
  CUlaunchConfig launch{};
  cubridge::detail::set_launch_shape(launch, c);
  expect_shape(launch);
  CUDA_KERNEL_NODE_PARAMS node{};
  cubridge::detail::set_launch_shape(node, c);
  expect_shape(node);
}

}  // namespace
