#pragma once
// Listeners told that a stream is about to be destroyed, while its handle is still valid: hot
// modules record a last event on it (hot_module.cpp). stream's destructor and
// before_stream_destroy() (stream.hpp) call notify; nothing else needs this header.

#include <cubridge/driver.hpp>

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
