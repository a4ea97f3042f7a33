#include <cubridge/core/detail/describe.hpp>

#include <cubridge/core/detail/hex.hpp>

namespace cubridge::detail {
std::string hex(std::uintptr_t value) {
  return hex_number(value);
}
}  // namespace cubridge::detail
