// Tests of cubridge/swap/error.hpp: the swap layer's codes keep the names they had in the core's
// enum before the layer owned its own (what logs, the update endpoint's answers and scripts
// match on).
#include <cubridge/swap/error.hpp>

#include <gtest/gtest.h>

namespace {

TEST(SwapErrc, KeepsItsSpelling) {
  EXPECT_EQ(cubridge::to_string(cubridge::swap_errc::version_rejected),
            "CUBRIDGE_VERSION_REJECTED");
}

}  // namespace
