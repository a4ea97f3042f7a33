#include <cubridge/launch_config.hpp>

#include <gtest/gtest.h>

namespace {

TEST(LaunchConfig, DefaultsAreOneThreadOnTheLegacyStreamWithoutCluster) {
  const cubridge::launch_config c;
  EXPECT_EQ(c.grid, (cubridge::dims{1, 1, 1}));
  EXPECT_EQ(c.block, (cubridge::dims{1, 1, 1}));
  EXPECT_EQ(c.dynamic_shared_bytes, 0u);
  EXPECT_EQ(c.stream, cubridge::stream_ref::legacy_default());
  EXPECT_EQ(c.cluster.x, 0u);
}

TEST(LaunchConfig, DimsVolumeDoesNotOverflow) {
  EXPECT_EQ((cubridge::dims{65535, 65535, 64}.volume()), 65535ull * 65535ull * 64ull);
}

TEST(LaunchConfig, DescribeNamesEveryPart) {
  cubridge::launch_config c{.grid = {4, 2}, .block = {256}, .dynamic_shared_bytes = 1024};
  EXPECT_EQ(c.describe(), "grid (4,2,1) block (256,1,1) shared 1024 B on stream 0x0");
  c.cluster = {2, 1, 1};
  EXPECT_EQ(c.describe(), "grid (4,2,1) block (256,1,1) shared 1024 B cluster (2,1,1) on stream 0x0");
}

TEST(LaunchConfig, ShapeGoesIntoBothDriverStructs) {
  const cubridge::launch_config c{.grid = {4, 2, 3}, .block = {32, 8, 2}, .dynamic_shared_bytes = 512};
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
