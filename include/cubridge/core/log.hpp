// cubridge's one logger: levels, one variable (CUBRIDGE_LOG_LEVEL), and a sink a service can
// take over. Written through spdlog (compiled into the library: a consumer needs no spdlog).
//
//   CUBRIDGE_LOG_LEVEL=info ./service     # trace | debug | info | warn (the default) | error | off
//   cubridge::log::set_sink([&](cubridge::log::level l, std::string_view line) { mine(l, line); });
//
// What is logged, by level: error, what failed where nobody could be told (a release that failed
// in a destructor); warn, what runs less safely than asked (the reset guard asked for and not
// loaded, MPS active under a sandbox that warns); info, what changed (a version promoted,
// refused or rolled back; an update received; a fleet node's apply); debug, what was found
// (the driver, its version, the helpers' paths).
#pragma once

#include <functional>
#include <optional>
#include <string_view>

namespace cubridge::log {

enum class level { trace, debug, info, warn, error, off };

/// "trace", "debug", "info", "warn", "error", "off".
[[nodiscard]] std::string_view name(level l) noexcept;
/// The inverse of name(), also accepting "warning"; nullopt for anything else.
[[nodiscard]] std::optional<level> parse_level(std::string_view text) noexcept;

/// The least severe level written: CUBRIDGE_LOG_LEVEL when first asked (a value parse_level does
/// not know is reported once, as a warning, and warn is used), or what set_threshold set.
[[nodiscard]] level threshold() noexcept;
void set_threshold(level l) noexcept;
[[nodiscard]] inline bool enabled(level l) noexcept {
  return l >= threshold() && l != level::off;
}

/// Receives each line that passes the threshold (the message only: no time, no level prefix).
/// Called from whichever thread logs, one line at a time.
using sink = std::function<void(level, std::string_view message)>;
/// Replaces where lines go and returns the previous sink; an empty sink restores the default,
/// which writes "<RFC 3339 time> cubridge <level>: <message>" to stderr.
sink set_sink(sink s);

/// Writes `message` at `l` if enabled(l). Never throws: a sink that throws loses its line.
void write(level l, std::string_view message) noexcept;

inline void trace(std::string_view m) noexcept {
  write(level::trace, m);
}
inline void debug(std::string_view m) noexcept {
  write(level::debug, m);
}
inline void info(std::string_view m) noexcept {
  write(level::info, m);
}
inline void warn(std::string_view m) noexcept {
  write(level::warn, m);
}
inline void error(std::string_view m) noexcept {
  write(level::error, m);
}

}  // namespace cubridge::log
