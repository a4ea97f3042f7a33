#pragma once
// Why an update gate refused or failed a bundle or a rollback request: one vocabulary for every
// door. The HTTP endpoint's status and "error" field, the fleet's result records and what a
// client sees all come from it; the names are the documented wire spellings
// (docs/update-endpoint.md), kept as they were.

#include <cubridge/bundle/bundle.hpp>

#include <optional>
#include <string_view>

namespace cubridge {

enum class gate_reason {
  none,  ///< applied or rolled back: no reason
  // The bundle or request did not verify (bundle_reason, named as on the wire).
  too_large,              ///< larger than the gate's max_bundle_bytes or verify_limits
  bad_magic,              ///< not a bundle
  unsupported_version,    ///< a bundle format this library does not read
  malformed,              ///< lengths inconsistent
  malformed_manifest,     ///< the manifest is not one JSON object
  invalid_manifest,       ///< the manifest breaks the schema
  unknown_key,            ///< signed by a key the gate does not trust
  unsigned_bundle,        ///< no signature
  bad_signature,          ///< the signature does not verify
  expired_bundle,         ///< past its expiry, or older than the gate's max age
  payload_mismatch,       ///< payload size or SHA-256 differ from the manifest
  payload_kind_mismatch,  ///< the payload is not what the manifest says
  target_mismatch,        ///< no code for the manifest's target
  bad_key,                ///< a key in text form could not be parsed
  // The gate's own checks.
  bad_request,       ///< a rollback request that does not parse
  not_started,       ///< the gate was never started
  name_mismatch,     ///< the signed module is not the one the request is for
  wrong_device,      ///< the bundle's target does not run on the sink's device
  replayed_version,  ///< this version was applied before (or serves)
  older_version,     ///< below the highest version seen
  expired_request,   ///< a rollback request outside the rollback window
  replayed_request,  ///< a rollback request's nonce was used before
  busy,              ///< too many rollback requests in the window
  version_mismatch,  ///< a rollback request names another serving version
  state_failed,      ///< the replay state could not be written
  // What the sink answered.
  unknown_module,       ///< the sink has no such module
  stage_refused,        ///< refused while staging: validation, compile, load, smoke test
  apply_failed,         ///< the sink failed otherwise; the serving version is unchanged
  no_previous_version,  ///< a rollback with nothing to go back to
  // Probation of a candidate (the sink's answers) and the node's record of bad versions: each
  // records the payload's digest as bad on the node (update_state::record_bad), so that it is
  // never staged there again.
  faulted_in_probation,   ///< the candidate faulted in a sandbox worker during its probation
  mismatch_in_probation,  ///< the candidate's outputs differed from the serving version's
  probation_incomplete,   ///< too few mirrored launches before the probation's deadline
  known_bad,              ///< the payload is recorded as bad on this node (refused unstaged)
  sticky_error,           ///< the version served when the process was poisoned
};

/// "too_large", "replayed_version", ... (the wire spelling); "" for none.
[[nodiscard]] std::string_view to_string(gate_reason reason) noexcept;
/// The reason spelled `name` exactly; nullopt for any other text (and for "").
[[nodiscard]] std::optional<gate_reason> parse_gate_reason(std::string_view name) noexcept;
/// The gate's reason for a bundle or request that failed verification with `reason`.
[[nodiscard]] gate_reason gate_reason_of(bundle_reason reason) noexcept;
/// Whether trying the same thing again may succeed with nothing else changed: the state could
/// not be written, or the gate was busy. Everything else is the bundle's (or request's) fault.
[[nodiscard]] constexpr bool transient(gate_reason reason) noexcept {
  return reason == gate_reason::state_failed || reason == gate_reason::busy;
}
/// Whether a version refused or failed for `reason` is recorded as bad on the node (its payload
/// digest, in the replay state): it faulted or differed in probation, or served when the
/// process was poisoned. Not probation_incomplete: too little traffic is a failure of this
/// attempt (the version is refused, the wave halts), not evidence against the code, so the same
/// version may be tried again.
[[nodiscard]] constexpr bool marks_bad(gate_reason reason) noexcept {
  return reason == gate_reason::faulted_in_probation ||
         reason == gate_reason::mismatch_in_probation || reason == gate_reason::sticky_error;
}

}  // namespace cubridge
