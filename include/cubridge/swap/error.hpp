#pragma once
// The swap layer's own error codes (domain "swap") and the exception a refused version raises.

#include <cubridge/core/error.hpp>

namespace cubridge {

/// Codes of the swap layer (error_source::cubridge, domain "swap").
enum class swap_errc {
  version_rejected = 1,  ///< a new module version failed validation; the current one serves on
};

inline constexpr std::array<error_code_info, 1> swap_error_codes{{
    {static_cast<int>(swap_errc::version_rejected), "CUBRIDGE_VERSION_REJECTED",
     "module version rejected"},
}};
inline constexpr error_domain swap_error_domain{"swap", swap_error_codes};
template <>
inline constexpr const error_domain* error_domain_of<swap_errc> = &swap_error_domain;

/// Raised when a staged module version fails validation (missing kernel, changed parameters,
/// resources, smoke test), or a promote or rollback is refused. The version that was serving
/// keeps serving.
class version_rejected_error : public error {
 public:
  version_rejected_error(std::string call, std::string involved,
                         std::source_location where = std::source_location::current())
      : error(swap_error_domain, static_cast<int>(swap_errc::version_rejected), {}, std::move(call),
              std::move(involved), where) {}
};

}  // namespace cubridge
