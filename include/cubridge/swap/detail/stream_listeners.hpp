#pragma once
// The swap layer's listeners told that a stream is about to be destroyed, while its handle is
// still valid: hot modules record a last event on it (hot_module_reclaim.cpp). The first listener
// installs the swap layer behind the core's one stream-destroy hook (set_stream_destroy_hook,
// stream.hpp), which stream's destructor and before_stream_destroy() call; the core knows nothing
// of this.

#include <cubridge/core/driver.hpp>

#include <cstdint>
#include <functional>

namespace cubridge::detail {

/// Registers `on_destroy`; returns the id that removes it. Listeners must not throw.
std::uint64_t add_stream_listener(std::function<void(CUstream)> on_destroy);
void remove_stream_listener(std::uint64_t id) noexcept;

/// Grows by one before each notification: a per-thread cache keyed by a stream handle compares
/// it to notice that the handle may since name another stream.
[[nodiscard]] std::uint64_t stream_generation() noexcept;

/// Tells every listener that `stream` is about to be destroyed.
void notify_stream_destroy(CUstream stream) noexcept;

}  // namespace cubridge::detail
