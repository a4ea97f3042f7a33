// The name tables of swap_target.hpp's closed sets.
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/swap/swap_target.hpp>

#include <array>

namespace cubridge {

namespace {
constexpr std::array<detail::enum_name<promote_condition>, 2> promote_condition_names{{
    {promote_condition::label_above_serving, "label_above_serving"},
    {promote_condition::always, "always"},
}};
static_assert(detail::lists_values_in_order(promote_condition_names));
constexpr std::array<detail::enum_name<apply_outcome>, 2> apply_outcome_names{{
    {apply_outcome::promoted, "promoted"},
    {apply_outcome::not_newer, "not_newer"},
}};
static_assert(detail::lists_values_in_order(apply_outcome_names));
}  // namespace

std::string_view to_string(promote_condition condition) noexcept {
  return detail::name_of(promote_condition_names, condition, "unknown");
}

std::string_view to_string(apply_outcome outcome) noexcept {
  return detail::name_of(apply_outcome_names, outcome, "unknown");
}

}  // namespace cubridge
