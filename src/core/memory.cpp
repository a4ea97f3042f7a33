// Implementations of device_buffer, pinned_buffer, copy, pointer queries and shared memory.
#include <cubridge/core/copy.hpp>
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>

#include <cuda_runtime_api.h>

#include <utility>

namespace cubridge {
namespace detail {

void* allocate_device(allocator_api api, context_ref ctx, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  scoped_current guard(ctx);
  const auto what = [&] { return std::to_string(bytes) + " bytes in " + ctx.describe(); };
  if (api == allocator_api::driver) {
    CUdeviceptr p = 0;
    CUBRIDGE_CU(cuMemAlloc, (&p, bytes), what());
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }
  void* p = nullptr;
  CUBRIDGE_CUDART(cudaMalloc(&p, bytes), what());
  return p;
}

void free_device(allocator_api api, context_ref ctx, void* pointer) noexcept {
  if (api == allocator_api::driver) {
    check_release(driver::api().cuMemFree(reinterpret_cast<CUdeviceptr>(pointer)), "cuMemFree");
    return;
  }
  // cudaFree works on the current context's memory: push the owner for the call.
  if (driver::api().cuCtxPushCurrent(ctx.get()) != CUDA_SUCCESS) return;
  (void)cudaFree(pointer);
  CUcontext popped = nullptr;
  check_release(driver::api().cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
}

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

context_ref context_of(const void* pointer) {
  CUcontext owner = nullptr;
  CUBRIDGE_CU(cuPointerGetAttribute, (&owner, CU_POINTER_ATTRIBUTE_CONTEXT, as_address(pointer)),
              "asking which context owns " + detail::hex(pointer));
  return context_ref::from_native(owner);
}

memory_kind memory_kind_of(const void* pointer) {
  unsigned type = 0;
  const CUresult r = driver::api().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                         as_address(pointer));
  if (r == CUDA_ERROR_INVALID_VALUE) return memory_kind::unregistered_host;
  if (r != CUDA_SUCCESS)
    detail::throw_driver_error(r, "cuPointerGetAttribute", "memory type of " + detail::hex(pointer),
                               std::source_location::current());
  unsigned managed = 0;
  if (driver::api().cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                          as_address(pointer)) == CUDA_SUCCESS &&
      managed)
    return memory_kind::managed;
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      return memory_kind::host;
    case CU_MEMORYTYPE_DEVICE:
      return memory_kind::device;
    case CU_MEMORYTYPE_ARRAY:
      return memory_kind::array;
    default:
      return memory_kind::unregistered_host;
  }
}

shared_device_memory shared_device_memory::allocate(cubridge::device dev, std::size_t bytes,
                                                    memory_export exportable) {
  const auto what = std::to_string(bytes) + " bytes of VMM memory on device " +
                    std::to_string(dev.ordinal()) +
                    (exportable == memory_export::posix_fd ? " (exportable as a POSIX fd)" : "");
  CUBRIDGE_EXPECTS(bytes > 0, what);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev.ordinal();
  if (exportable == memory_export::posix_fd)
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t granularity = 0;
  CUBRIDGE_CU(cuMemGetAllocationGranularity,
              (&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), what);
  const std::size_t size = (bytes + granularity - 1) / granularity * granularity;

  CUmemGenericAllocationHandle handle = 0;
  CUBRIDGE_CU(cuMemCreate, (&handle, size, &prop, 0), what);
  // From here each step undoes the previous ones when it fails.
  CUdeviceptr address = 0;
  if (const CUresult r = driver::api().cuMemAddressReserve(&address, size, granularity, 0, 0);
      r != CUDA_SUCCESS) {
    driver::api().cuMemRelease(handle);
    detail::throw_driver_error(r, "cuMemAddressReserve", what, std::source_location::current());
  }
  if (const CUresult r = driver::api().cuMemMap(address, size, 0, handle, 0); r != CUDA_SUCCESS) {
    driver::api().cuMemAddressFree(address, size);
    driver::api().cuMemRelease(handle);
    detail::throw_driver_error(r, "cuMemMap", what, std::source_location::current());
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult r = driver::api().cuMemSetAccess(address, size, &access, 1);
      r != CUDA_SUCCESS) {
    driver::api().cuMemUnmap(address, size);
    driver::api().cuMemAddressFree(address, size);
    driver::api().cuMemRelease(handle);
    detail::throw_driver_error(r, "cuMemSetAccess", what, std::source_location::current());
  }
  return shared_device_memory(dev, handle, address, size, exportable);
}

unique_fd shared_device_memory::export_fd() const {
  const auto what = std::to_string(size_) + " bytes of VMM memory at " + detail::hex(address_) +
                    " on device " + std::to_string(device_.ordinal());
  CUBRIDGE_EXPECTS(address_ != 0, "exporting a moved-from shared_device_memory");
  CUBRIDGE_EXPECTS(export_ == memory_export::posix_fd,
                   what + " was not allocated with memory_export::posix_fd");
  int fd = -1;
  CUBRIDGE_CU(cuMemExportToShareableHandle,
              (&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "exporting " + what);
  return unique_fd(fd);
}

shared_device_memory::shared_device_memory(shared_device_memory&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, 0)),
      address_(std::exchange(other.address_, 0)),
      size_(std::exchange(other.size_, 0)),
      export_(other.export_) {}

shared_device_memory& shared_device_memory::operator=(shared_device_memory&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, 0);
    address_ = std::exchange(other.address_, 0);
    size_ = std::exchange(other.size_, 0);
    export_ = other.export_;
  }
  return *this;
}

shared_device_memory::~shared_device_memory() {
  reset();
}

void shared_device_memory::reset() noexcept {
  if (!address_) return;
  const auto& api = driver::api();
  detail::check_release(api.cuMemUnmap(address_, size_), "cuMemUnmap");
  detail::check_release(api.cuMemAddressFree(address_, size_), "cuMemAddressFree");
  detail::check_release(api.cuMemRelease(handle_), "cuMemRelease");
  address_ = 0;
  handle_ = 0;
  size_ = 0;
}

}  // namespace cubridge
