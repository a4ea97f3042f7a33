#pragma once
// The update layer's own error codes (domain "update"). A refused bundle, manifest, key or
// rollback request raises bundle_error (bundle.hpp), whose reason() says which check failed.

#include <cubridge/core/error.hpp>

namespace cubridge {

/// Codes of the update layer (error_source::cubridge, domain "update").
enum class update_errc {
  bad_bundle = 1,  ///< a signed module bundle was refused (see bundle_error::reason)
};

inline constexpr std::array<error_code_info, 1> update_error_codes{{
    {static_cast<int>(update_errc::bad_bundle), "CUBRIDGE_BAD_BUNDLE", "module bundle refused"},
}};
inline constexpr error_domain update_error_domain{"update", update_error_codes};
template <>
inline constexpr const error_domain* error_domain_of<update_errc> = &update_error_domain;

}  // namespace cubridge
