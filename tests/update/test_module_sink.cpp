// Tests of cubridge/update/module_sink.hpp: the apply rule keeps its spelling, and a version not
// above the serving one is refused in the gate's words, naming both versions.
#include <cubridge/update/module_sink.hpp>

#include <gtest/gtest.h>

namespace {

TEST(ApplyRule, KeepsItsSpelling) {
  using cubridge::to_string;
  using r = cubridge::apply_rule;
  EXPECT_EQ(to_string(r::above_serving), "above_serving");
  EXPECT_EQ(to_string(r::operator_word), "operator_word");
  EXPECT_EQ(to_string(static_cast<r>(99)), "unknown");
}

TEST(NotNewerResult, IsAReplayWhenEqualAndOlderWhenBelow) {
  const auto same = cubridge::not_newer_result("filters", 7, 7);
  EXPECT_EQ(same.reason, cubridge::gate_reason::replayed_version);
  EXPECT_EQ(same.serving_version, 7u);
  const auto older = cubridge::not_newer_result("filters", 5, 9);
  EXPECT_EQ(older.reason, cubridge::gate_reason::older_version);
  EXPECT_EQ(older.serving_version, 9u);
  EXPECT_EQ(older.detail, "module 'filters' v5 is not above v9, which serves");
}

}  // namespace
