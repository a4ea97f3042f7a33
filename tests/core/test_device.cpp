#include <cubridge/core/device.hpp>
#include <cubridge/core/error.hpp>

#include "gpu_test.hpp"

namespace {

TEST(Device, EnumeratesAndReportsProperties) {
  CUBRIDGE_REQUIRE_GPU();
  ASSERT_GE(cubridge::device::count(), 1);
  const auto dev = cubridge::device::get(0);
  EXPECT_EQ(dev.ordinal(), 0);
  EXPECT_FALSE(dev.name().empty());
  const auto cc = dev.capability();
  EXPECT_GE(cc.major, 7);
  EXPECT_EQ(cc.as_int(), cc.major * 10 + cc.minor);
  EXPECT_GT(dev.total_memory(), std::size_t{1} << 30);
  EXPECT_GT(dev.multiprocessor_count(), 0);
  EXPECT_EQ(dev.multiprocessor_count(), dev.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
  const auto uuid = dev.uuid();
  bool any_nonzero = false;
  for (auto b : uuid) any_nonzero |= b != 0;
  EXPECT_TRUE(any_nonzero);
  EXPECT_EQ(dev, cubridge::device::from_native(dev.get()));
}

TEST(Device, OrdinalOutOfRangeIsAnErrorNamingIt) {
  CUBRIDGE_REQUIRE_GPU();
  try {
    (void)cubridge::device::get(cubridge::device::count() + 7);
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.code(), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_NE(std::string(e.what()).find("device ordinal"), std::string::npos) << e.what();
  }
}

TEST(Device, PrimaryStateIsReadable) {
  CUBRIDGE_REQUIRE_GPU();
  const auto state = cubridge::device::get(0).primary_state();
  // Nothing in this process touched the primary context.
  EXPECT_FALSE(state.active);
}

}  // namespace
