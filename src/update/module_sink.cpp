#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/update/module_sink.hpp>

#include <array>
#include <string>

namespace cubridge {

namespace {
constexpr std::array<detail::enum_name<apply_rule>, 2> apply_rule_names{{
    {apply_rule::above_serving, "above_serving"},
    {apply_rule::operator_word, "operator_word"},
}};
static_assert(detail::lists_values_in_order(apply_rule_names));
}  // namespace

std::string_view to_string(apply_rule rule) noexcept {
  return detail::name_of(apply_rule_names, rule, "unknown");
}

bool module_sink::probe_health() const noexcept {
  return process_poisoned();
}

sink_result not_newer_result(std::string_view module, std::uint64_t version,
                             std::uint64_t serving) {
  return {version == serving ? gate_reason::replayed_version : gate_reason::older_version, serving,
          "module '" + std::string(module) + "' v" + std::to_string(version) + " is not above v" +
              std::to_string(serving) + ", which serves"};
}

}  // namespace cubridge
