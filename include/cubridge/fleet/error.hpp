#pragma once
// The fleet's own error codes (domain "fleet", docs/fleet.md): what cubridge::fleet raises when
// the NATS server cannot be reached, refuses a call, holds a stream configured otherwise, or
// cannot carry a bundle.

#include <cubridge/core/error.hpp>

namespace cubridge {

/// Codes of the fleet (error_source::cubridge, domain "fleet").
enum class fleet_errc {
  unreachable = 1,  ///< no NATS server answered at the URL, or the connection was lost
  nats_failed,      ///< a NATS or JetStream call failed (the server refused, a timeout)
  config_mismatch,  ///< a stream or bucket exists with another configuration than docs/fleet.md's
  oversized,        ///< a bundle larger than the server's largest message
  refused,          ///< the server refused this identity (no or wrong credentials, TLS)
  conflict,         ///< another writer changed the desired state first (compare-and-set)
  older_version,    ///< a lower version than desired, outside an explicit rollback
  invalid_state,    ///< the bucket holds a record that does not verify or parse
};

inline constexpr std::array<error_code_info, 8> fleet_error_codes{{
    {static_cast<int>(fleet_errc::unreachable), "CUBRIDGE_FLEET_UNREACHABLE",
     "NATS server unreachable"},
    {static_cast<int>(fleet_errc::nats_failed), "CUBRIDGE_FLEET_NATS_FAILED", "NATS call failed"},
    {static_cast<int>(fleet_errc::config_mismatch), "CUBRIDGE_FLEET_CONFIG_MISMATCH",
     "stream or bucket configured otherwise"},
    {static_cast<int>(fleet_errc::oversized), "CUBRIDGE_FLEET_OVERSIZED",
     "larger than the server's largest message"},
    {static_cast<int>(fleet_errc::refused), "CUBRIDGE_FLEET_REFUSED",
     "the server refused this identity"},
    {static_cast<int>(fleet_errc::conflict), "CUBRIDGE_FLEET_CONFLICT",
     "another writer changed the desired state first"},
    {static_cast<int>(fleet_errc::older_version), "CUBRIDGE_FLEET_OLDER_VERSION",
     "a lower version than desired outside a rollback"},
    {static_cast<int>(fleet_errc::invalid_state), "CUBRIDGE_FLEET_INVALID_STATE",
     "the bucket holds a record that does not verify"},
}};
inline constexpr error_domain fleet_error_domain{"fleet", fleet_error_codes};
template <>
inline constexpr const error_domain* error_domain_of<fleet_errc> = &fleet_error_domain;

}  // namespace cubridge
