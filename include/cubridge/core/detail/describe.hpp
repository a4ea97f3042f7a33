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

}  // namespace cubridge::detail
