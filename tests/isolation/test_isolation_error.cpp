// Tests of cubridge/isolation/error.hpp: the isolation layer's codes keep the names they had in
// the core's enum before the layer owned its own (what logs and scripts match on).
#include <cubridge/isolation/error.hpp>

#include <gtest/gtest.h>

namespace {

TEST(IsolationErrc, KeepsItsSpelling) {
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::guest_damage), "CUBRIDGE_GUEST_DAMAGE");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::sandbox_failure),
            "CUBRIDGE_SANDBOX_FAILURE");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::mps_active), "CUBRIDGE_MPS_ACTIVE");
  EXPECT_EQ(cubridge::to_string(static_cast<cubridge::isolation_errc>(4)), "CUBRIDGE_UNKNOWN");
}

}  // namespace
