// The name tables of rollout_words.hpp.
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/fleet/rollout_words.hpp>

#include <array>

namespace cubridge::fleet {

namespace {
// Every signal but none (spelled ""), from 1.
constexpr std::array<cubridge::detail::enum_name<halt_signal>, 10> halt_signal_names{{
    {halt_signal::sticky_error, "sticky_error"},
    {halt_signal::probe, "probe"},
    {halt_signal::failure_rate, "failure_rate"},
    {halt_signal::metric, "metric"},
    {halt_signal::baseline_unhealthy, "baseline_unhealthy"},
    {halt_signal::canary_lost, "canary_lost"},
    {halt_signal::canary_restarted, "canary_restarted"},
    {halt_signal::canary_left, "canary_left"},
    {halt_signal::result, "result"},
    {halt_signal::deadline, "deadline"},
}};
static_assert(cubridge::detail::lists_values_in_order(halt_signal_names, 1));

constexpr std::array<cubridge::detail::enum_name<rollout_step>, 5> rollout_step_names{{
    {rollout_step::started, "started"},
    {rollout_step::applied, "applied"},
    {rollout_step::passed, "passed"},
    {rollout_step::halted, "halted"},
    {rollout_step::completed, "completed"},
}};
static_assert(cubridge::detail::lists_values_in_order(rollout_step_names));
}  // namespace

std::string_view to_string(halt_signal signal) noexcept {
  if (signal == halt_signal::none) return {};
  return cubridge::detail::name_of(halt_signal_names, signal, "unknown");
}

std::optional<halt_signal> parse_halt_signal(std::string_view name) noexcept {
  return cubridge::detail::value_of(halt_signal_names, name);
}

std::string signal_text(halt_signal signal, std::string_view metric) {
  if (signal == halt_signal::metric) return "metric:" + std::string(metric);
  return std::string(to_string(signal));
}

std::string_view to_string(rollout_step step) noexcept {
  return cubridge::detail::name_of(rollout_step_names, step, "unknown");
}

}  // namespace cubridge::fleet
