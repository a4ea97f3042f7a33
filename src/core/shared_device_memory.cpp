// shared_device_memory.hpp: VMM device memory mapped here and exportable to another process.
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/shared_device_memory.hpp>

#include <string>
#include <utility>

namespace cubridge {

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
