// The gate's reasons and their wire spellings (gate_reason.hpp).
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/update/gate_reason.hpp>

#include <array>

namespace cubridge {
namespace {

constexpr std::array<detail::enum_name<gate_reason>, 35> gate_reason_names{{
    {gate_reason::none, "none"},
    {gate_reason::too_large, "too_large"},
    {gate_reason::bad_magic, "bad_magic"},
    {gate_reason::unsupported_version, "unsupported_version"},
    {gate_reason::malformed, "malformed"},
    {gate_reason::malformed_manifest, "malformed_manifest"},
    {gate_reason::invalid_manifest, "invalid_manifest"},
    {gate_reason::unknown_key, "unknown_key"},
    {gate_reason::unsigned_bundle, "unsigned_bundle"},
    {gate_reason::bad_signature, "bad_signature"},
    {gate_reason::expired_bundle, "expired_bundle"},
    {gate_reason::payload_mismatch, "payload_mismatch"},
    {gate_reason::payload_kind_mismatch, "payload_kind_mismatch"},
    {gate_reason::target_mismatch, "target_mismatch"},
    {gate_reason::bad_key, "bad_key"},
    {gate_reason::bad_request, "bad_request"},
    {gate_reason::not_started, "not_started"},
    {gate_reason::name_mismatch, "name_mismatch"},
    {gate_reason::wrong_device, "wrong_device"},
    {gate_reason::replayed_version, "replayed_version"},
    {gate_reason::older_version, "older_version"},
    {gate_reason::expired_request, "expired_request"},
    {gate_reason::replayed_request, "replayed_request"},
    {gate_reason::busy, "busy"},
    {gate_reason::version_mismatch, "version_mismatch"},
    {gate_reason::state_failed, "state_failed"},
    {gate_reason::unknown_module, "unknown_module"},
    {gate_reason::stage_refused, "stage_refused"},
    {gate_reason::apply_failed, "apply_failed"},
    {gate_reason::no_previous_version, "no_previous_version"},
    {gate_reason::faulted_in_probation, "faulted_in_probation"},
    {gate_reason::mismatch_in_probation, "mismatch_in_probation"},
    {gate_reason::probation_incomplete, "probation_incomplete"},
    {gate_reason::known_bad, "known_bad"},
    {gate_reason::sticky_error, "sticky_error"},
}};
static_assert(detail::lists_values_in_order(gate_reason_names));

}  // namespace

std::string_view to_string(gate_reason reason) noexcept {
  if (reason == gate_reason::none) return {};
  return detail::name_of(gate_reason_names, reason, "unknown");
}

std::optional<gate_reason> parse_gate_reason(std::string_view name) noexcept {
  const auto reason = detail::value_of(gate_reason_names, name);
  if (reason == gate_reason::none) return std::nullopt;
  return reason;
}

gate_reason gate_reason_of(bundle_reason reason) noexcept {
  switch (reason) {
    case bundle_reason::too_large:
      return gate_reason::too_large;
    case bundle_reason::bad_magic:
      return gate_reason::bad_magic;
    case bundle_reason::unsupported_version:
      return gate_reason::unsupported_version;
    case bundle_reason::malformed:
      return gate_reason::malformed;
    case bundle_reason::malformed_manifest:
      return gate_reason::malformed_manifest;
    case bundle_reason::invalid_manifest:
      return gate_reason::invalid_manifest;
    case bundle_reason::unknown_key:
      return gate_reason::unknown_key;
    case bundle_reason::unsigned_bundle:
      return gate_reason::unsigned_bundle;
    case bundle_reason::bad_signature:
      return gate_reason::bad_signature;
    case bundle_reason::expired:
      return gate_reason::expired_bundle;
    case bundle_reason::payload_mismatch:
      return gate_reason::payload_mismatch;
    case bundle_reason::payload_kind_mismatch:
      return gate_reason::payload_kind_mismatch;
    case bundle_reason::target_mismatch:
      return gate_reason::target_mismatch;
    case bundle_reason::wrong_device:
      return gate_reason::wrong_device;
    case bundle_reason::bad_key:
      return gate_reason::bad_key;
  }
  return gate_reason::bad_request;
}

}  // namespace cubridge
