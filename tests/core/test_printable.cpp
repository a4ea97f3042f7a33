// The one escaper for untrusted text (detail/printable.hpp), checked byte for byte against the
// three hand-written escapers it replaced, so every message, status and terminal line stays
// as it was.
#include <cubridge/core/detail/printable.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace {

using cubridge::detail::printable;
using cubridge::detail::printable_cut;
using cubridge::detail::printable_escape;
using cubridge::detail::printable_options;

// The options each former escaper now passes.
constexpr printable_options name_options{};  // bundle_manifest.cpp, signing.hpp's callers
constexpr printable_options status_options{.max_bytes = 256 - 3,
                                           .quoted = false,
                                           .escape = printable_escape::c_string,
                                           .cut = printable_cut::ellipsis};
printable_options server_options(std::size_t max_bytes = 300) {
  return {.max_bytes = max_bytes,
          .quoted = false,
          .escape = printable_escape::hex,
          .cut = printable_cut::counted};
}

// What bundle_manifest.cpp's printable(name) returned before detail/printable.hpp existed.
std::string old_name_printable(std::string_view name) {
  std::string out = "'";
  for (char c : name.substr(0, 64)) out += (c >= 0x20 && c < 0x7F) ? c : '?';
  return out + (name.size() > 64 ? "...'" : "'");
}

// What update_endpoint::impl::status_summary returned (max_summary_bytes 256).
std::string old_status_summary(std::string_view text) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    std::string piece;
    if (c == '\\')
      piece = "\\\\";
    else if (u >= 0x20 && u < 0x7F)
      piece = std::string(1, c);
    else
      piece = {'\\', 'x', digits[u >> 4], digits[u & 0xF]};
    if (out.size() + piece.size() > 256 - 3) return out + "...";
    out += piece;
  }
  return out;
}

// What tools/update/server_text.cpp's printable(text, max_bytes) returned.
std::string old_server_printable(std::string_view text, std::size_t max_bytes = 300) {
  static constexpr char hex_digits[] = "0123456789ABCDEF";
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

// Texts around every cut: each byte alone, runs of one byte (1 or 4 output bytes each, '\' 2 in
// the status) at lengths around 64, 253 to 256 and 300, and every byte in turn at those lengths.
std::vector<std::string> sample_texts() {
  std::vector<std::string> texts = {"", "module 'filters' v3", "a\\b", std::string("a\0b", 3)};
  for (int b = 0; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
  const std::vector<std::size_t> lengths = {2,   3,   62,  63,  64,  65,  66,  100, 101,
                                            126, 127, 128, 250, 251, 252, 253, 254, 255,
                                            256, 257, 258, 299, 300, 301, 302, 1000};
  for (const std::size_t n : lengths) {
    for (const char c : {'a', '\x1b', '\\', '\x7f', '\xc3'}) texts.emplace_back(n, c);
    std::string every_byte;
    for (std::size_t i = 0; i < n; ++i) every_byte += static_cast<char>(i % 256);
    texts.push_back(every_byte);
    std::string mostly_ascii(n, 'x');
    mostly_ascii[n / 2] = '\\';
    mostly_ascii[n - 1] = '\n';
    texts.push_back(mostly_ascii);
  }
  return texts;
}

TEST(Printable, IsByteIdenticalToTheEscapersItReplaced) {
  for (const auto& text : sample_texts()) {
    EXPECT_EQ(printable(text), old_name_printable(text)) << "length " << text.size();
    EXPECT_EQ(printable(text, name_options), old_name_printable(text));
    EXPECT_EQ(printable(text, status_options), old_status_summary(text))
        << "length " << text.size();
    EXPECT_EQ(printable(text, server_options()), old_server_printable(text))
        << "length " << text.size();
    for (const std::size_t max : {0u, 1u, 100u})
      EXPECT_EQ(printable(text, server_options(max)), old_server_printable(text, max));
  }
}

TEST(Printable, EmptyTextIsEmptyOrTwoQuotes) {
  EXPECT_EQ(printable(""), "''");
  EXPECT_EQ(printable("", status_options), "");
  EXPECT_EQ(printable("", server_options()), "");
  EXPECT_EQ(printable("", server_options(0)), "") << "nothing was cut";
}

TEST(Printable, QuestionMarkReplacesControlBytesDelAndNonAsciiAndKeepsBackslash) {
  EXPECT_EQ(printable("a\x1b[31m\r\n\t\x7f"
                      "b"),
            "'a?[31m????b'");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "'a?b'");
  EXPECT_EQ(printable("\xc3\xa9t\xc3\xa9"), "'?\?t?\?'") << "one '?' per byte of UTF-8";
  EXPECT_EQ(printable("\x80\xff"), "'?\?'");
  EXPECT_EQ(printable(" ~a\\b'"), "' ~a\\b''") << "0x20 to 0x7E kept, quotes not escaped";
}

TEST(Printable, HexShowsEveryOtherByteAndBackslashInUpperCase) {
  const auto opts = server_options();
  EXPECT_EQ(printable("\x1b[2K\rok\x07\\\x7f\n", opts), "\\x1B[2K\\x0Dok\\x07\\x5C\\x7F\\x0A");
  EXPECT_EQ(printable(std::string("a\0b", 3), opts), "a\\x00b");
  EXPECT_EQ(printable("\x80\xc2\x9b"
                      "31m\xff",
                      opts),
            "\\x80\\xC2\\x9B31m\\xFF");
  EXPECT_EQ(printable(" ~", opts), " ~");
}

TEST(Printable, CStringShowsBackslashDoubledAndOtherBytesInLowerCase) {
  EXPECT_EQ(printable("\x1b[31mred\x1b[0m \xc3\xa9 back\\slash", status_options),
            "\\x1b[31mred\\x1b[0m \\xc3\\xa9 back\\\\slash");
  EXPECT_EQ(printable(std::string("\0\x1f\x7f\x80\xff", 5), status_options),
            "\\x00\\x1f\\x7f\\x80\\xff");
}

TEST(Printable, EllipsisKeepsWholeEscapesWithinMaxBytes) {
  // Quoted: 64 bytes inside the quotes, the cut inside them too.
  EXPECT_EQ(printable(std::string(64, 'n')), "'" + std::string(64, 'n') + "'");
  EXPECT_EQ(printable(std::string(65, 'n')), "'" + std::string(64, 'n') + "...'");
  EXPECT_EQ(printable(std::string(65, '\x01')), "'" + std::string(64, '?') + "...'");
  // Not quoted: max_bytes counts the escapes, never half of one.
  const printable_options seven{
      .max_bytes = 7, .quoted = false, .escape = printable_escape::c_string};
  EXPECT_EQ(printable("ab\x01"
                      "cd",
                      seven),
            "ab\\x01c...");
  EXPECT_EQ(printable("abc\x01", seven), "abc\\x01") << "exactly max_bytes, nothing cut";
  EXPECT_EQ(printable("abc\x01"
                      "d",
                      seven),
            "abc\\x01...");
  EXPECT_EQ(printable("abcd\x01", seven), "abcd...") << "\\x01 would not fit";
  EXPECT_EQ(printable("abcdef\\", seven), "abcdef...");
  // The status: at most 256 bytes, "..." included.
  const auto status = printable(std::string(1000, '\x1b'), status_options);
  EXPECT_EQ(status, [] {
    std::string s;
    for (int i = 0; i < 63; ++i) s += "\\x1b";
    return s + "...";
  }());
  EXPECT_LE(status.size(), 256u);
  EXPECT_EQ(printable(std::string(253, 'x'), status_options), std::string(253, 'x'));
  EXPECT_EQ(printable(std::string(254, 'x'), status_options), std::string(253, 'x') + "...");
}

TEST(Printable, CountedKeepsMaxBytesOfTheTextAndSaysHowManyMore) {
  EXPECT_EQ(printable(std::string(10000, 'A'), server_options()),
            std::string(300, 'A') + "... (9700 more bytes)");
  EXPECT_EQ(printable(std::string(300, 'A'), server_options()), std::string(300, 'A'));
  EXPECT_EQ(printable("\x1b\x1b\x1b", server_options(2)), "\\x1B\\x1B... (1 more bytes)")
      << "max_bytes counts the text, not its escapes";
  EXPECT_EQ(printable("abc", server_options(0)), "... (3 more bytes)");
  // Quoted (tools/update/arguments.cpp's shown()): the count inside the quotes.
  auto quoted = server_options(100);
  quoted.quoted = true;
  EXPECT_EQ(printable(std::string(150, '7'), quoted),
            "'" + std::string(100, '7') + "... (50 more bytes)'");
  EXPECT_EQ(printable("0\x1b", quoted), "'0\\x1B'");
}

TEST(Printable, MessagesTheCallersBuildStayAsTheyWere) {
  // bundle_manifest.cpp, update_state.cpp, rollback_request.cpp: field and module names.
  EXPECT_EQ("unknown field " + printable("evil\x1b[2J"), "unknown field 'evil?[2J'");
  EXPECT_EQ("module " + printable("filters") + " v3", "module 'filters' v3");
  EXPECT_EQ("nonce " + printable(std::string(70, 'f')) + " is not 32 lower-case hex digits",
            "nonce '" + std::string(64, 'f') + "...' is not 32 lower-case hex digits");
  // update_endpoint.cpp: a refusal the status keeps.
  const auto summary = printable(
      "422 stage_refused: \x1b[31mred\x1b[0m \xc3\xa9 back\\slash " + std::string(10000, 'x'),
      status_options);
  EXPECT_TRUE(
      summary.starts_with("422 stage_refused: \\x1b[31mred\\x1b[0m \\xc3\\xa9 "
                          "back\\\\slash xxx"))
      << summary;
  EXPECT_TRUE(summary.ends_with("...")) << summary;
  EXPECT_EQ(summary.size(), 256u);
  // tools/update/push.cpp: an endpoint's answer on the terminal.
  EXPECT_EQ("promoted '" + printable("filters\x1b]0;pwned\x07", server_options()) + "'",
            "promoted 'filters\\x1B]0;pwned\\x07'");
}

}  // namespace
