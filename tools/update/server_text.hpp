#pragma once
// Text that crosses the wire: what an endpoint answers is shown on a terminal only escaped and
// bounded, and module names go into URLs percent-encoded.
#include <cstddef>
#include <string>
#include <string_view>

namespace cubridge::tool {

/// `text` safe to print: printable ASCII is kept; a backslash, every control character (ESC, CR,
/// ...) and every byte outside ASCII is written as \xNN, so an endpoint cannot move the cursor,
/// recolour or rewrite a line. At most `max_bytes` of `text` are shown, then
/// "... (N more bytes)". The CLI's choice of cubridge::detail::printable's options.
[[nodiscard]] std::string printable(std::string_view text, std::size_t max_bytes = 300);

/// One URL path segment: RFC 3986 unreserved characters (A-Z a-z 0-9 - . _ ~) kept, every other
/// byte as %XX, so a name with a space, '%', '/', '?', '#' or UTF-8 reaches the endpoint intact.
[[nodiscard]] std::string percent_encode(std::string_view segment);

}  // namespace cubridge::tool
