// Tests of cubridge/update/module_sink.hpp: the outcomes keep their spelling (the update
// endpoint's answers carry them).
#include <cubridge/update/module_sink.hpp>

#include <gtest/gtest.h>

namespace {

TEST(SinkOutcome, KeepsItsSpelling) {
  using cubridge::to_string;
  using o = cubridge::sink_outcome;
  EXPECT_EQ(to_string(o::done), "done");
  EXPECT_EQ(to_string(o::unknown_module), "unknown_module");
  EXPECT_EQ(to_string(o::rejected), "rejected");
  EXPECT_EQ(to_string(o::no_previous_version), "no_previous_version");
  EXPECT_EQ(to_string(o::failed), "failed");
  EXPECT_EQ(to_string(static_cast<o>(99)), "unknown");
}

}  // namespace
