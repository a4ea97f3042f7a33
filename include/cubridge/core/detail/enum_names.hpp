#pragma once
// Enum names spelled once: a constexpr table per enum, {value, name} in declaration order, and
// one lookup each way. The table is checked at compile time to list the values 0, 1, 2, ... in
// order, each once (static_assert(detail::lists_values_in_order(table))). What a switch's
// -Wswitch gave and a table cannot: a value added at the END of an enum without a row is not a
// compile error; each enum's test spells every name, so it fails there.

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

namespace cubridge::detail {

template <class Enum>
struct enum_name {
  Enum value;
  std::string_view name;
};

/// Whether `table` lists the values first .. first + N - 1 in order, each with a non-empty name.
template <class Enum, std::size_t N>
[[nodiscard]] constexpr bool lists_values_in_order(const std::array<enum_name<Enum>, N>& table,
                                                   std::size_t first = 0) noexcept {
  for (std::size_t i = 0; i < N; ++i)
    if (static_cast<std::size_t>(static_cast<std::underlying_type_t<Enum>>(table[i].value)) !=
            first + i ||
        table[i].name.empty())
      return false;
  return true;
}

/// The name of `value` in `table`, or `unknown` for a value it does not list.
template <class Enum, std::size_t N>
[[nodiscard]] constexpr std::string_view name_of(const std::array<enum_name<Enum>, N>& table,
                                                 Enum value, std::string_view unknown) noexcept {
  for (const auto& row : table)
    if (row.value == value) return row.name;
  return unknown;
}

/// The value named exactly `name` in `table`, or nullopt.
template <class Enum, std::size_t N>
[[nodiscard]] constexpr std::optional<Enum> value_of(const std::array<enum_name<Enum>, N>& table,
                                                     std::string_view name) noexcept {
  for (const auto& row : table)
    if (row.name == name) return row.value;
  return std::nullopt;
}

}  // namespace cubridge::detail
