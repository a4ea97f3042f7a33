// Tests of cubridge/core/compute_capability.hpp: the one parser and formatter of "sm_90a". No GPU.
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/device.hpp>

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <type_traits>

namespace {

using cubridge::arch_variant;
using cubridge::compute_capability;
using cubridge::parse_compute_capability;

// The parser runs at compile time too.
static_assert(parse_compute_capability("sm_90a") ==
              compute_capability{9, 0, arch_variant::arch_specific});
static_assert(!parse_compute_capability("sm_090"));
// device::capability() returns this very type.
static_assert(std::is_same_v<decltype(cubridge::device::get(0).capability()), compute_capability>);

TEST(ComputeCapability, ParsesRealArchitectureNames) {
  const struct {
    std::string_view name;
    compute_capability expected;
  } cases[] = {
      {"sm_90", {9, 0}},
      {"sm_86", {8, 6}},
      {"sm_90a", {9, 0, arch_variant::arch_specific}},
      {"sm_100f", {10, 0, arch_variant::family_specific}},
      {"sm_103a", {10, 3, arch_variant::arch_specific}},
      {"sm_120", {12, 0}},
      {"sm_10", {1, 0}},
      {"sm_999", {99, 9}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto parsed = parse_compute_capability(c.name);
    ASSERT_TRUE(parsed);
    EXPECT_EQ(*parsed, c.expected);
    EXPECT_EQ(cubridge::to_string(*parsed), c.name);  // the formatter writes what it read
  }
}

TEST(ComputeCapability, RefusesEverythingElse) {
  for (const std::string_view name :
       {"sm90", "sm_9", "sm_090", "sm_1000", "compute_90", "sm_90b", "sm_", "", "SM_90", " sm_90",
        "sm_90 ", "sm_90af", "sm_9a0", "sm_a90", "sm_+90", "lto_90", "sm_90\n"}) {
    SCOPED_TRACE(std::string(name));
    EXPECT_FALSE(parse_compute_capability(name));
  }
}

TEST(ComputeCapability, FormatsAsIntAndName) {
  EXPECT_EQ((compute_capability{9, 0}).as_int(), 90);
  EXPECT_EQ((compute_capability{10, 3, arch_variant::family_specific}).as_int(), 103);
  EXPECT_EQ(cubridge::to_string(compute_capability{8, 6}), "sm_86");
  EXPECT_EQ(cubridge::to_string(compute_capability{12, 0, arch_variant::arch_specific}), "sm_120a");
}

TEST(ComputeCapability, ComparesByNumbersThenVariant) {
  const compute_capability sm90{9, 0}, sm90a{9, 0, arch_variant::arch_specific};
  EXPECT_LT((compute_capability{8, 9}), sm90);
  EXPECT_LT(sm90, (compute_capability{10, 0}));
  EXPECT_LT(sm90, sm90a);
  EXPECT_NE(sm90, sm90a);
  EXPECT_EQ(sm90a.numbers(), sm90);  // what a device of that capability reports
}

}  // namespace
