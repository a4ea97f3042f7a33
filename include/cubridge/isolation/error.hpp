#pragma once
// The isolation layer's own error codes (domain "isolation"). Their exceptions carry what the
// guest broke or why the worker failed: guest_error (guest_context.hpp), sandbox_error
// (sandbox.hpp); or why isolation was refused: mps_active_error (mps_policy.hpp).

#include <cubridge/core/error.hpp>

namespace cubridge {

/// Codes of the isolation layer (error_source::cubridge, domain "isolation").
enum class isolation_errc {
  guest_damage = 1,  ///< a guest call broke the host's state (see guest_error::findings)
  sandbox_failure,   ///< a sandboxed call failed in its worker (see sandbox_error::reason)
  mps_active,        ///< refused: NVIDIA MPS serves the device (see mps_active_error)
};

inline constexpr std::array<error_code_info, 3> isolation_error_codes{{
    {static_cast<int>(isolation_errc::guest_damage), "CUBRIDGE_GUEST_DAMAGE",
     "a guest call broke the host's state"},
    {static_cast<int>(isolation_errc::sandbox_failure), "CUBRIDGE_SANDBOX_FAILURE",
     "the sandbox worker failed"},
    {static_cast<int>(isolation_errc::mps_active), "CUBRIDGE_MPS_ACTIVE",
     "NVIDIA MPS serves the device: isolation does not contain faults there"},
}};
inline constexpr error_domain isolation_error_domain{"isolation", isolation_error_codes};
template <>
inline constexpr const error_domain* error_domain_of<isolation_errc> = &isolation_error_domain;

}  // namespace cubridge
