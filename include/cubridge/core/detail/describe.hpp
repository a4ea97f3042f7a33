#pragma once
// Short texts that name CUDA handles in error messages.

#include <cstdint>
#include <string>

namespace cubridge::detail {

/// "0x7f12ab34" for any handle or address.
std::string hex(std::uintptr_t value);
template <class Handle>
std::string hex(Handle* handle) {
  return hex(reinterpret_cast<std::uintptr_t>(handle));
}

/// "stream 0x7f12ab34", "event 0x7f12ab34": a stream or event as an error message names it.
template <class Handle>
std::string stream_name(Handle* stream) {
  return "stream " + hex(stream);
}
template <class Handle>
std::string event_name(Handle* event) {
  return "event " + hex(event);
}

}  // namespace cubridge::detail
