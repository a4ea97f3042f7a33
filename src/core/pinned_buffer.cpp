// pinned_buffer.hpp: page-locked host memory (cuMemAllocHost).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <string>

namespace cubridge {

namespace detail {

void* allocate_pinned(context_ref ctx, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  scoped_current guard(ctx);
  void* p = nullptr;
  CUBRIDGE_CU(cuMemAllocHost, (&p, bytes),
              std::to_string(bytes) + " bytes of pinned host memory for " + ctx.describe());
  return p;
}

void free_pinned(void* pointer) noexcept {
  check_release(driver::api().cuMemFreeHost(pointer), "cuMemFreeHost");
}

}  // namespace detail

}  // namespace cubridge
