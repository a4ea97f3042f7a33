// The logger of log.hpp. spdlog formats and writes the default sink's lines (one write per line,
// so that lines of several threads never interleave); a user's sink gets the bare message.
#include <cubridge/core/log.hpp>

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace cubridge::log {
namespace {

constexpr level default_level = level::warn;
constexpr int unset = -1;

std::atomic<int> chosen_threshold{unset};

level from_environment() noexcept {
  const char* text = std::getenv("CUBRIDGE_LOG_LEVEL");
  if (text == nullptr || *text == '\0') return default_level;
  if (const auto parsed = parse_level(text)) return *parsed;
  // The logger cannot report on itself through itself before it has a threshold.
  std::fprintf(stderr,
               "cubridge: warning: CUBRIDGE_LOG_LEVEL='%s' is not one of trace, debug, info, "
               "warn, error, off: logging at warn\n",
               text);
  return default_level;
}

std::shared_ptr<spdlog::logger> make_stderr_logger() {
  auto logger = std::make_shared<spdlog::logger>("cubridge",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  // RFC 3339 in local time with its offset, e.g. 2026-12-02T17:40:03.127+00:00.
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z cubridge %l: %v");
  logger->set_level(spdlog::level::trace);  // the threshold is ours, checked before
  return logger;
}

spdlog::level::level_enum spdlog_level(level l) noexcept {
  switch (l) {
    case level::trace:
      return spdlog::level::trace;
    case level::debug:
      return spdlog::level::debug;
    case level::info:
      return spdlog::level::info;
    case level::warn:
      return spdlog::level::warn;
    case level::error:
      return spdlog::level::err;
    case level::off:
      break;
  }
  return spdlog::level::off;
}

struct destination {
  std::mutex mutex;
  sink user;  // empty: the stderr logger
  std::shared_ptr<spdlog::logger> stderr_logger = make_stderr_logger();
};

destination& the_destination() {
  static destination d;  // built on first use: a static of another file may log at start
  return d;
}

}  // namespace

std::string_view name(level l) noexcept {
  switch (l) {
    case level::trace:
      return "trace";
    case level::debug:
      return "debug";
    case level::info:
      return "info";
    case level::warn:
      return "warn";
    case level::error:
      return "error";
    case level::off:
      return "off";
  }
  return "off";
}

std::optional<level> parse_level(std::string_view text) noexcept {
  for (const level l :
       {level::trace, level::debug, level::info, level::warn, level::error, level::off})
    if (text == name(l)) return l;
  if (text == "warning") return level::warn;
  return std::nullopt;
}

level threshold() noexcept {
  int value = chosen_threshold.load(std::memory_order_relaxed);
  if (value == unset) {
    int expected = unset;
    const int read = static_cast<int>(from_environment());
    // Two first callers read the same variable; the one that loses takes the winner's value.
    value = chosen_threshold.compare_exchange_strong(expected, read) ? read : expected;
  }
  return static_cast<level>(value);
}

void set_threshold(level l) noexcept {
  chosen_threshold.store(static_cast<int>(l));
}

sink set_sink(sink s) {
  auto& d = the_destination();
  std::lock_guard lock(d.mutex);
  return std::exchange(d.user, std::move(s));
}

void write(level l, std::string_view message) noexcept {
  if (!enabled(l)) return;
  try {
    auto& d = the_destination();
    sink user;
    {
      std::lock_guard lock(d.mutex);
      user = d.user;
    }
    // Outside the lock: a sink may itself call code that logs.
    if (user)
      user(l, message);
    else
      d.stderr_logger->log(spdlog_level(l), "{}", message);
  } catch (...) {  // a log line is never worth an exception in the caller
  }
}

}  // namespace cubridge::log
