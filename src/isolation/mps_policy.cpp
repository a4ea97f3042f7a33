#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/isolation/mps_policy.hpp>

#include <cubridge/core/log.hpp>

#include <array>
#include <mutex>
#include <utility>

namespace cubridge {

std::string_view to_string(mps_policy policy) noexcept {
  static constexpr std::array<detail::enum_name<mps_policy>, 3> names{{
      {mps_policy::allow, "allow"},
      {mps_policy::warn, "warn"},
      {mps_policy::refuse, "refuse"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, policy, "unknown");
}

namespace {

std::string refusal(const std::string& component, const mps_status& status) {
  return component + " refused on device " + std::to_string(status.device) + ": " + status.meaning +
         "; set its mps option to mps_policy::warn or allow to run it anyway";
}

constexpr std::string_view warning_prefix = "cubridge: warning: ";

/// The default: the process's logger (log.hpp), which stamps its own prefix.
void write_to_log(std::string_view line) {
  if (line.starts_with(warning_prefix)) line.remove_prefix(warning_prefix.size());
  log::warn(line);
}

struct warning_sink {
  std::mutex mutex;
  mps_warning_sink sink = write_to_log;
};

warning_sink& process_sink() {
  static warning_sink s;
  return s;
}

}  // namespace

mps_active_error::mps_active_error(std::string component, mps_status status,
                                   std::source_location where)
    : error(isolation_error_domain, static_cast<int>(isolation_errc::mps_active), {},
            "enforce_mps_policy", refusal(component, status), where),
      component_(std::move(component)),
      status_(std::move(status)) {}

mps_warning_sink set_mps_warning_sink(mps_warning_sink sink) {
  auto& s = process_sink();
  std::lock_guard lock(s.mutex);
  return std::exchange(s.sink, sink ? std::move(sink) : mps_warning_sink(write_to_log));
}

void enforce_mps_policy(mps_policy policy, int device, std::string_view component) {
  if (policy == mps_policy::allow) return;
  enforce_mps_policy(policy, detect_mps(device), component);
}

void enforce_mps_policy(mps_policy policy, const mps_status& status, std::string_view component) {
  if (policy == mps_policy::allow || !status.active) return;
  if (policy == mps_policy::refuse) throw mps_active_error(std::string(component), status);
  mps_warning_sink sink;
  {
    auto& s = process_sink();
    std::lock_guard lock(s.mutex);
    sink = s.sink;
  }
  // Called outside the lock: a sink may log through code that warns again.
  sink(std::string(warning_prefix) + std::string(component) + " on device " +
       std::to_string(status.device) + " does not contain faults: " + status.meaning);
}

}  // namespace cubridge
