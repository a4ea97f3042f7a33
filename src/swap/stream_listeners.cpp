// The swap layer's stream-destroy listeners (swap/detail/stream_listeners.hpp), behind the core's
// one generic hook (set_stream_destroy_hook, core/stream.hpp).
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/detail/stream_listeners.hpp>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace cubridge::detail {
namespace {

struct stream_listeners {
  std::mutex mutex;
  std::vector<std::pair<std::uint64_t, std::function<void(CUstream)>>> listeners;
  std::uint64_t next_id = 1;
  std::atomic<std::uint64_t> generation{0};
  stream_destroy_hook previous = nullptr;  // the hook installed before ours, called after ours
};

stream_listeners& listeners() {
  // Never destroyed: a stream with static storage may die after any function-local static.
  static auto* instance = new stream_listeners;
  return *instance;
}

void on_stream_destroy(CUstream stream) noexcept {
  notify_stream_destroy(stream);
  if (const auto previous = listeners().previous) previous(stream);
}

}  // namespace

std::uint64_t add_stream_listener(std::function<void(CUstream)> on_destroy) {
  auto& l = listeners();
  // Installed with the first listener: before it, no hot module can hold a stream, so no
  // per-thread cache can need the generation to have moved.
  static std::once_flag installed;
  std::call_once(installed, [&l] { l.previous = set_stream_destroy_hook(&on_stream_destroy); });
  std::lock_guard lock(l.mutex);
  l.listeners.emplace_back(l.next_id, std::move(on_destroy));
  return l.next_id++;
}

void remove_stream_listener(std::uint64_t id) noexcept {
  auto& l = listeners();
  std::lock_guard lock(l.mutex);
  std::erase_if(l.listeners, [id](const auto& entry) { return entry.first == id; });
}

std::uint64_t stream_generation() noexcept {
  return listeners().generation.load(std::memory_order_acquire);
}

void notify_stream_destroy(CUstream stream) noexcept {
  auto& l = listeners();
  l.generation.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard lock(l.mutex);
  for (const auto& [id, on_destroy] : l.listeners) on_destroy(stream);
}

}  // namespace cubridge::detail
