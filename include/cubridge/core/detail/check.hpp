#pragma once
// The check for driver and runtime calls. The description of what was involved is built only on
// failure, so checks cost one compare on the success path.

#include <cubridge/core/error.hpp>

#include <cuda.h>
#include <driver_types.h>

#include <source_location>
#include <string>
#include <utility>

namespace cubridge::detail {

[[noreturn]] void throw_driver_error(CUresult result, const char* call, std::string involved,
                                     std::source_location where);
[[noreturn]] void throw_runtime_error(cudaError_t result, const char* call, std::string involved,
                                      std::source_location where);

/// Name of a CUresult ("CUDA_ERROR_INVALID_HANDLE"); works without a driver for common codes.
std::string driver_error_name(CUresult result);

}  // namespace cubridge::detail

// CUBRIDGE_CU(fn, (args...), involved-expr): calls driver::api().fn(args...) and throws
// cubridge::error naming fn, the CUresult and `involved` (evaluated only on failure).
#define CUBRIDGE_CU(fn, args, involved)                                         \
  do {                                                                          \
    const CUresult cubridge_result_ = ::cubridge::driver::api().fn args;        \
    if (cubridge_result_ != CUDA_SUCCESS) [[unlikely]]                          \
      ::cubridge::detail::throw_driver_error(cubridge_result_, #fn, (involved), \
                                             std::source_location::current());  \
  } while (false)

// CUBRIDGE_CUDART(call-expr, involved-expr): checks a Runtime API call.
#define CUBRIDGE_CUDART(call, involved)                                            \
  do {                                                                             \
    const cudaError_t cubridge_result_ = (call);                                   \
    if (cubridge_result_ != cudaSuccess) [[unlikely]]                              \
      ::cubridge::detail::throw_runtime_error(cubridge_result_, #call, (involved), \
                                              std::source_location::current());    \
  } while (false)

namespace cubridge::detail {
/// For destructors, which never throw: tolerates CUDA_ERROR_DEINITIALIZED (process exit) and a
/// context destroyed behind our back (CUDA_ERROR_CONTEXT_IS_DESTROYED); anything else is
/// reported on stderr and, in Debug builds (NDEBUG not defined), fails an assert (RMM's
/// ..._SAFE_SHUTDOWN): a failed release is a bug, not a condition to carry on from.
void report_release_failure(CUresult result, const char* call) noexcept;
inline void check_release(CUresult result, const char* call) noexcept {
  if (result != CUDA_SUCCESS) [[unlikely]]
    report_release_failure(result, call);
}
}  // namespace cubridge::detail
