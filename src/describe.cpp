#include <cubridge/detail/describe.hpp>

#include <cstdio>

namespace cubridge::detail {
std::string hex(std::uintptr_t value) {
  char buffer[2 + 16 + 1];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}
}  // namespace cubridge::detail
