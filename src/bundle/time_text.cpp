// The manifest's time form (bundle.hpp's detail::format_time / parse_time): RFC 3339 UTC in
// whole seconds, "YYYY-MM-DDTHH:MM:SSZ", through Howard Hinnant's date library (C++20's
// std::chrono::parse and std::format of times are not in GCC 12).
#include <cubridge/bundle/bundle.hpp>

#include <date/date.h>

#include <locale>
#include <sstream>

namespace cubridge::detail {
namespace {

constexpr const char* time_form = "%Y-%m-%dT%H:%M:%SZ";

}  // namespace

std::string format_time(std::chrono::sys_seconds time) {
  return date::format(std::locale::classic(), time_form, time);
}

std::optional<std::chrono::sys_seconds> parse_time(std::string_view text) {
  std::istringstream in{std::string(text)};
  in.imbue(std::locale::classic());
  std::chrono::sys_seconds time;
  in >> date::parse(time_form, time);
  if (in.fail() || in.peek() != std::char_traits<char>::eof()) return std::nullopt;
  // date::parse reads fields of fewer digits ("2027-1-5T0:0:0Z") and signs: only the one
  // spelling that format_time writes is the manifest's, so a signed time has one text.
  if (format_time(time) != text) return std::nullopt;
  return time;
}

}  // namespace cubridge::detail
