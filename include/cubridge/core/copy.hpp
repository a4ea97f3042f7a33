#pragma once
// Copies between any two memories the driver knows (device, pinned or pageable host), using
// unified addressing: cuMemcpy / cuMemcpyAsync infer the direction from the addresses.
// They run in the calling thread's current context (push one with scoped_current).

#include <cubridge/core/device_span.hpp>
#include <cubridge/core/stream_ref.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

namespace cubridge {

/// Copies `bytes` from `source` to `destination` and waits for it. @throws error naming both
/// addresses and the size.
void copy_bytes(void* destination, const void* source, std::size_t bytes);
/// Enqueues the copy on `stream` and returns. @throws error naming addresses, size and stream.
void copy_bytes_async(void* destination, const void* source, std::size_t bytes, stream_ref stream);

/// Typed copies; the destination must hold at least as many elements as the source.
/// @throws error (errc::precondition) when it does not.
template <class T>
void copy(device_span<T> destination, std::span<const std::type_identity_t<T>> source);
template <class T>
void copy(std::span<T> destination, device_span<const std::type_identity_t<T>> source);
template <class T>
void copy(device_span<T> destination, device_span<const std::type_identity_t<T>> source);
template <class T>
void copy_async(device_span<T> destination, std::span<const std::type_identity_t<T>> source,
                stream_ref stream);
template <class T>
void copy_async(std::span<T> destination, device_span<const std::type_identity_t<T>> source,
                stream_ref stream);
template <class T>
void copy_async(device_span<T> destination, device_span<const std::type_identity_t<T>> source,
                stream_ref stream);

namespace detail {
void check_copy_fits(std::size_t destination_bytes, std::size_t source_bytes);
}

template <class T>
void copy(device_span<T> destination, std::span<const std::type_identity_t<T>> source) {
  detail::check_copy_fits(destination.size_bytes(), source.size_bytes());
  copy_bytes(destination.data(), source.data(), source.size_bytes());
}
template <class T>
void copy(std::span<T> destination, device_span<const std::type_identity_t<T>> source) {
  detail::check_copy_fits(destination.size_bytes(), source.size_bytes());
  copy_bytes(destination.data(), source.data(), source.size_bytes());
}
template <class T>
void copy(device_span<T> destination, device_span<const std::type_identity_t<T>> source) {
  detail::check_copy_fits(destination.size_bytes(), source.size_bytes());
  copy_bytes(destination.data(), source.data(), source.size_bytes());
}
template <class T>
void copy_async(device_span<T> destination, std::span<const std::type_identity_t<T>> source,
                stream_ref stream) {
  detail::check_copy_fits(destination.size_bytes(), source.size_bytes());
  copy_bytes_async(destination.data(), source.data(), source.size_bytes(), stream);
}
template <class T>
void copy_async(std::span<T> destination, device_span<const std::type_identity_t<T>> source,
                stream_ref stream) {
  detail::check_copy_fits(destination.size_bytes(), source.size_bytes());
  copy_bytes_async(destination.data(), source.data(), source.size_bytes(), stream);
}
template <class T>
void copy_async(device_span<T> destination, device_span<const std::type_identity_t<T>> source,
                stream_ref stream) {
  detail::check_copy_fits(destination.size_bytes(), source.size_bytes());
  copy_bytes_async(destination.data(), source.data(), source.size_bytes(), stream);
}

}  // namespace cubridge
