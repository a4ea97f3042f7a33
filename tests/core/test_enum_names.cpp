// Enum names spelled once (detail/enum_names.hpp): the generic lookups, and the core's enums
// spelled as before they moved onto tables. The other layers' enums are tested in their own
// folders (tests/bundle/test_bundle.cpp, tests/swap/test_swap_error.cpp,
// tests/isolation/test_isolation_error.cpp, tests/update/test_module_sink.cpp and
// test_update_state.cpp).
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>

#include <gtest/gtest.h>

#include <array>
#include <string_view>
#include <utility>

namespace {

using cubridge::detail::enum_name;

enum class colour { red, green, blue };

constexpr std::array<enum_name<colour>, 3> colour_names{{
    {colour::red, "red"},
    {colour::green, "green"},
    {colour::blue, "blue"},
}};
static_assert(cubridge::detail::lists_values_in_order(colour_names));

// Out of order, a gap, a repeat, an empty name: each refused at compile time.
static_assert(!cubridge::detail::lists_values_in_order(std::array<enum_name<colour>, 2>{{
    {colour::green, "green"},
    {colour::red, "red"},
}}));
static_assert(!cubridge::detail::lists_values_in_order(std::array<enum_name<colour>, 2>{{
    {colour::red, "red"},
    {colour::blue, "blue"},
}}));
static_assert(!cubridge::detail::lists_values_in_order(std::array<enum_name<colour>, 2>{{
    {colour::red, "red"},
    {colour::red, "again"},
}}));
static_assert(!cubridge::detail::lists_values_in_order(std::array<enum_name<colour>, 1>{{
    {colour::red, ""},
}}));

TEST(enum_names, name_of_and_value_of_are_inverse_and_exact) {
  for (const auto& row : colour_names) {
    EXPECT_EQ(cubridge::detail::name_of(colour_names, row.value, "?"), row.name);
    EXPECT_EQ(cubridge::detail::value_of(colour_names, row.name), row.value);
  }
  EXPECT_EQ(cubridge::detail::name_of(colour_names, static_cast<colour>(7), "unknown"), "unknown");
  EXPECT_FALSE(cubridge::detail::value_of(colour_names, "Red"));
  EXPECT_FALSE(cubridge::detail::value_of(colour_names, "re"));
  EXPECT_FALSE(cubridge::detail::value_of(colour_names, ""));
  static_assert(cubridge::detail::value_of(colour_names, "blue") == colour::blue);
}

TEST(enum_names, errc_keeps_its_spelling) {
  using e = cubridge::errc;
  constexpr std::array<std::pair<e, std::string_view>, 7> expected{{
      {e::no_driver, "CUBRIDGE_NO_DRIVER"},
      {e::bad_image, "CUBRIDGE_BAD_IMAGE"},
      {e::incompatible_image, "CUBRIDGE_INCOMPATIBLE_IMAGE"},
      {e::bad_launch_arguments, "CUBRIDGE_BAD_LAUNCH_ARGUMENTS"},
      {e::context_reset, "CUBRIDGE_CONTEXT_RESET"},
      {e::precondition, "CUBRIDGE_PRECONDITION"},
      {e::io, "CUBRIDGE_IO"},
  }};
  for (const auto& [value, name] : expected) EXPECT_EQ(cubridge::to_string(value), name);
  EXPECT_EQ(cubridge::to_string(static_cast<e>(0)), "CUBRIDGE_UNKNOWN");
  EXPECT_EQ(cubridge::to_string(static_cast<e>(8)), "CUBRIDGE_UNKNOWN");
}

TEST(enum_names, image_kinds_keep_their_spelling) {
  using cubridge::to_string;
  EXPECT_EQ(to_string(cubridge::image_kind::cubin), "cubin");
  EXPECT_EQ(to_string(cubridge::image_kind::fatbin), "fatbin");
  EXPECT_EQ(to_string(cubridge::image_kind::ptx), "ptx");
  EXPECT_EQ(to_string(cubridge::image_kind::lto_ir), "lto_ir");
  EXPECT_EQ(to_string(static_cast<cubridge::image_kind>(99)), "unknown");
}

}  // namespace
