// The scoped-current guard's out-of-line halves (scoped_current.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>

namespace cubridge {

scoped_current::pop_function scoped_current::push(context_ref ctx) {
  const auto& cu = driver::api();
  if (const CUresult r = cu.cuCtxPushCurrent(ctx.get()); r != CUDA_SUCCESS) [[unlikely]]
    detail::throw_driver_error(r, "cuCtxPushCurrent", "making current " + ctx.describe(),
                               std::source_location::current());
  return cu.cuCtxPopCurrent;
}

void scoped_current::pop_failed(CUresult result) noexcept {
  detail::report_release_failure(result, "cuCtxPopCurrent");
}

}  // namespace cubridge
