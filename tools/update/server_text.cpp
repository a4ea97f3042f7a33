#include "update/server_text.hpp"

namespace cubridge::tool {
namespace {
constexpr char hex_digits[] = "0123456789ABCDEF";
}  // namespace

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  const auto shown = text.substr(0, max_bytes);
  for (const char ch : shown) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += ch;
    } else {
      out += "\\x";
      out += hex_digits[c >> 4];
      out += hex_digits[c & 0xf];
    }
  }
  if (text.size() > shown.size())
    out += "... (" + std::to_string(text.size() - shown.size()) + " more bytes)";
  return out;
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
