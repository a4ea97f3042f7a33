// The core's one generic stream-destroy hook (stream.hpp): no GPU needed, the hook only passes a
// handle along.
#include <cubridge/core/stream.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace {

std::vector<CUstream> seen;
void record(CUstream s) noexcept {
  seen.push_back(s);
}

TEST(StreamDestroyHook, TheInstalledHookIsToldTheHandleAndReplacingItReturnsTheOldOne) {
  seen.clear();
  const auto fake = reinterpret_cast<CUstream>(0x1234);
  EXPECT_EQ(cubridge::set_stream_destroy_hook(&record), nullptr) << "the core installs none";
  cubridge::before_stream_destroy(fake);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], fake);
  EXPECT_EQ(cubridge::set_stream_destroy_hook(nullptr), &record);
  cubridge::before_stream_destroy(fake);  // no hook: nothing is called
  EXPECT_EQ(seen.size(), 1u);
}

}  // namespace
