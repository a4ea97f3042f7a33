#include "update/server_text.hpp"

#include <cubridge/core/detail/printable.hpp>

namespace cubridge::tool {
namespace {
constexpr char hex_digits[] = "0123456789ABCDEF";
}  // namespace

std::string printable(std::string_view text, std::size_t max_bytes) {
  return detail::printable(text, {.max_bytes = max_bytes,
                                  .quoted = false,
                                  .escape = detail::printable_escape::hex,
                                  .cut = detail::printable_cut::counted});
}

std::string percent_encode(std::string_view segment) {
  std::string out;
  for (const char ch : segment) {
    const auto c = static_cast<unsigned char>(ch);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += ch;
    } else {
      out += '%';
      out += hex_digits[c >> 4];
      out += hex_digits[c & 0xf];
    }
  }
  return out;
}

}  // namespace cubridge::tool
