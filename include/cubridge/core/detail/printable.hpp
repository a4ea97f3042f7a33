#pragma once
// Untrusted text (names and fields from a bundle or a request, an endpoint's answers) made safe
// for a message, a status or a terminal, one way everywhere: which bytes are kept, how the others
// are shown and how a long text is cut are the options of one function.

#include <cstddef>
#include <string>
#include <string_view>

namespace cubridge::detail {

/// How printable() shows a byte outside printable ASCII (0x20 to 0x7E).
enum class printable_escape {
  question_mark,  ///< as '?', '\' kept: short but lossy, for names in error messages
  hex,            ///< as "\xNN" in upper case, '\' as "\x5C" too: what `cubridge push` prints
  c_string,       ///< as "\xnn" in lower case, '\' as "\\": the update endpoint's status
};

/// How printable() cuts a text longer than max_bytes.
enum class printable_cut {
  ellipsis,  ///< whole escapes while they fit in max_bytes bytes, then "..."
  counted,   ///< the first max_bytes bytes of the text escaped, then "... (N more bytes)"
};

struct printable_options {
  std::size_t max_bytes = 64;  ///< what is kept (see printable_cut), quotes and cut not counted
  bool quoted = true;          ///< in single quotes, the cut inside them
  printable_escape escape = printable_escape::question_mark;
  printable_cut cut = printable_cut::ellipsis;
};

/// `text` as `options` say it may appear in a message. The defaults are those of a name from
/// untrusted input: quoted, its first 64 bytes with anything but printable ASCII as '?', "..."
/// when longer. Throws std::bad_alloc only.
[[nodiscard]] std::string printable(std::string_view text, printable_options options = {});

}  // namespace cubridge::detail
