#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/update/module_sink.hpp>

#include <array>

namespace cubridge {

namespace {
constexpr std::array<detail::enum_name<sink_outcome>, 5> sink_outcome_names{{
    {sink_outcome::done, "done"},
    {sink_outcome::unknown_module, "unknown_module"},
    {sink_outcome::rejected, "rejected"},
    {sink_outcome::no_previous_version, "no_previous_version"},
    {sink_outcome::failed, "failed"},
}};
static_assert(detail::lists_values_in_order(sink_outcome_names));
}  // namespace

std::string_view to_string(sink_outcome outcome) noexcept {
  return detail::name_of(sink_outcome_names, outcome, "unknown");
}

}  // namespace cubridge
