// Enum names spelled once (detail/enum_names.hpp): the generic lookups, and every spelling of
// the enums moved onto tables, unchanged from the switches they replaced.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/isolation/error.hpp>
#include <cubridge/swap/error.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_state.hpp>

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

TEST(enum_names, bundle_reasons_keep_their_spelling) {
  using r = cubridge::bundle_reason;
  constexpr std::array<std::pair<r, std::string_view>, 15> expected{{
      {r::too_large, "too_large"},
      {r::bad_magic, "bad_magic"},
      {r::unsupported_version, "unsupported_version"},
      {r::malformed, "malformed"},
      {r::malformed_manifest, "malformed_manifest"},
      {r::invalid_manifest, "invalid_manifest"},
      {r::unknown_key, "unknown_key"},
      {r::unsigned_bundle, "unsigned_bundle"},
      {r::bad_signature, "bad_signature"},
      {r::expired, "expired"},
      {r::payload_mismatch, "payload_mismatch"},
      {r::payload_kind_mismatch, "payload_kind_mismatch"},
      {r::target_mismatch, "target_mismatch"},
      {r::wrong_device, "wrong_device"},
      {r::bad_key, "bad_key"},
  }};
  for (const auto& [value, name] : expected) EXPECT_EQ(cubridge::to_string(value), name);
  EXPECT_EQ(cubridge::to_string(static_cast<r>(99)), "unknown");
}

TEST(enum_names, payload_kinds_keep_their_spelling) {
  using k = cubridge::payload_kind;
  EXPECT_EQ(cubridge::to_string(k::cubin), "cubin");
  EXPECT_EQ(cubridge::to_string(k::fatbin), "fatbin");
  EXPECT_EQ(cubridge::to_string(k::cuda_source), "cuda_source");
  EXPECT_EQ(cubridge::to_string(static_cast<k>(99)), "unknown");
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

// The other layers' codes kept the names they had in the core's enum before each layer owned
// its own (what logs, the update endpoint's answers and scripts match on).
TEST(enum_names, layer_codes_keep_their_spelling) {
  EXPECT_EQ(cubridge::to_string(cubridge::swap_errc::version_rejected),
            "CUBRIDGE_VERSION_REJECTED");
  EXPECT_EQ(cubridge::to_string(cubridge::update_errc::bad_bundle), "CUBRIDGE_BAD_BUNDLE");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::guest_damage), "CUBRIDGE_GUEST_DAMAGE");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::sandbox_failure),
            "CUBRIDGE_SANDBOX_FAILURE");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::mps_active), "CUBRIDGE_MPS_ACTIVE");
  EXPECT_EQ(cubridge::to_string(static_cast<cubridge::isolation_errc>(4)), "CUBRIDGE_UNKNOWN");
}

TEST(enum_names, image_kinds_sink_outcomes_and_state_reasons_keep_their_spelling) {
  using cubridge::to_string;
  EXPECT_EQ(to_string(cubridge::image_kind::cubin), "cubin");
  EXPECT_EQ(to_string(cubridge::image_kind::fatbin), "fatbin");
  EXPECT_EQ(to_string(cubridge::image_kind::ptx), "ptx");
  EXPECT_EQ(to_string(cubridge::image_kind::lto_ir), "lto_ir");
  EXPECT_EQ(to_string(static_cast<cubridge::image_kind>(99)), "unknown");

  using o = cubridge::sink_outcome;
  EXPECT_EQ(to_string(o::done), "done");
  EXPECT_EQ(to_string(o::unknown_module), "unknown_module");
  EXPECT_EQ(to_string(o::rejected), "rejected");
  EXPECT_EQ(to_string(o::no_previous_version), "no_previous_version");
  EXPECT_EQ(to_string(o::failed), "failed");
  EXPECT_EQ(to_string(static_cast<o>(99)), "unknown");

  using u = cubridge::update_state_reason;
  EXPECT_EQ(to_string(u::unreadable), "unreadable");
  EXPECT_EQ(to_string(u::too_large), "too_large");
  EXPECT_EQ(to_string(u::corrupt), "corrupt");
  EXPECT_EQ(to_string(u::write_failed), "write_failed");
  EXPECT_EQ(to_string(static_cast<u>(99)), "unknown");
}

}  // namespace
