// The swap layer's stream-destroy listeners behind the core's generic hook: installed with the
// first listener, chained to a hook installed before, counted by the generation. No GPU needed.
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/detail/stream_listeners.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace {

std::vector<CUstream> earlier_hook_saw;
void earlier_hook(CUstream s) noexcept {
  earlier_hook_saw.push_back(s);
}

TEST(StreamListeners, TheFirstListenerInstallsTheSwapLayerBehindTheHookChainedToTheEarlierOne) {
  namespace d = cubridge::detail;
  ASSERT_EQ(cubridge::set_stream_destroy_hook(&earlier_hook), nullptr);
  std::vector<CUstream> listener_saw;
  const auto id = d::add_stream_listener([&](CUstream s) { listener_saw.push_back(s); });
  const auto fake = reinterpret_cast<CUstream>(0x5678);
  const auto generation = d::stream_generation();
  cubridge::before_stream_destroy(fake);  // what ~stream and raw-stream users call
  EXPECT_EQ(listener_saw, std::vector<CUstream>{fake});
  EXPECT_EQ(earlier_hook_saw, std::vector<CUstream>{fake}) << "the earlier hook is still called";
  EXPECT_EQ(d::stream_generation(), generation + 1);
  d::remove_stream_listener(id);
  cubridge::before_stream_destroy(fake);
  EXPECT_EQ(listener_saw.size(), 1u) << "a removed listener is not called";
  EXPECT_EQ(earlier_hook_saw.size(), 2u);
  EXPECT_EQ(d::stream_generation(), generation + 2);
}

}  // namespace
