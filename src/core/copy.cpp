// copy.hpp: byte copies between any memory the driver knows (cuMemcpy, cuMemcpyAsync).
#include <cubridge/core/copy.hpp>
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>

#include <string>

namespace cubridge {

namespace detail {

void check_copy_fits(std::size_t destination_bytes, std::size_t source_bytes) {
  if (destination_bytes < source_bytes)
    throw_errc(errc::precondition, "cubridge::copy",
               "destination of " + std::to_string(destination_bytes) +
                   " bytes is smaller than the source of " + std::to_string(source_bytes));
}

}  // namespace detail

namespace {
CUdeviceptr as_address(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}
std::string describe_copy(void* d, const void* s, std::size_t bytes) {
  return std::to_string(bytes) + " bytes from " + detail::hex(s) + " to " + detail::hex(d);
}
}  // namespace

void copy_bytes(void* destination, const void* source, std::size_t bytes) {
  if (bytes == 0) return;
  CUBRIDGE_CU(cuMemcpy, (as_address(destination), as_address(source), bytes),
              describe_copy(destination, source, bytes));
}

void copy_bytes_async(void* destination, const void* source, std::size_t bytes, stream_ref stream) {
  if (bytes == 0) return;
  CUBRIDGE_CU(
      cuMemcpyAsync, (as_address(destination), as_address(source), bytes, stream.get()),
      describe_copy(destination, source, bytes) + " on stream " + detail::hex(stream.get()));
}

}  // namespace cubridge
