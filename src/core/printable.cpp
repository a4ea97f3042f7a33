#include <cubridge/core/detail/printable.hpp>

#include <cubridge/core/detail/hex.hpp>

namespace cubridge::detail {
namespace {

constexpr char upper_hex_digits[] = "0123456789ABCDEF";

constexpr bool is_printable_ascii(unsigned char c) noexcept {
  return c >= 0x20 && c < 0x7F;
}

// Appends byte `c` to `out` as `escape` shows it.
void append_shown(std::string& out, unsigned char c, printable_escape escape) {
  switch (escape) {
    case printable_escape::question_mark:
      out += is_printable_ascii(c) ? static_cast<char>(c) : '?';
      return;
    case printable_escape::hex:
      if (is_printable_ascii(c) && c != '\\') {
        out += static_cast<char>(c);
      } else {
        out += "\\x";
        out += upper_hex_digits[c >> 4];
        out += upper_hex_digits[c & 0xF];
      }
      return;
    case printable_escape::c_string:
      if (c == '\\') {
        out += "\\\\";
      } else if (is_printable_ascii(c)) {
        out += static_cast<char>(c);
      } else {
        out += "\\x";
        append_hex(out, c);
      }
      return;
  }
}

}  // namespace

std::string printable(std::string_view text, printable_options options) {
  std::string out;
  if (options.quoted) out += '\'';
  const std::size_t start = out.size();
  std::size_t shown = 0;  // bytes of `text` in `out`
  for (; shown < text.size(); ++shown) {
    if (options.cut == printable_cut::counted && shown == options.max_bytes) break;
    const std::size_t before = out.size();
    append_shown(out, static_cast<unsigned char>(text[shown]), options.escape);
    if (options.cut == printable_cut::ellipsis && out.size() - start > options.max_bytes) {
      out.resize(before);  // never half an escape
      break;
    }
  }
  if (shown < text.size()) {
    if (options.cut == printable_cut::ellipsis)
      out += "...";
    else
      out += "... (" + std::to_string(text.size() - shown) + " more bytes)";
  }
  if (options.quoted) out += '\'';
  return out;
}

}  // namespace cubridge::detail
