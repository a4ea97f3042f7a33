#include "buffer_mappings.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>

#include <cstdint>

namespace cubridge_worker {

namespace {
std::string name(CUresult r) {
  return cubridge::detail::driver_error_name(r);
}
}  // namespace

std::string buffer_mappings::map(const cubridge::detail::sandbox_protocol::buffer_descriptor& d,
                                 cubridge::unique_fd fd, int device, std::size_t granularity) {
  if (mappings_.count(d.id)) return {};
  const auto& cu = cubridge::driver::api();
  const std::string what = "buffer " + std::to_string(d.id) + " (" + std::to_string(d.size_bytes) +
                           " bytes at host address " + cubridge::detail::hex(d.host_address) + ")";
  if (d.device != device)
    return what + " lives on device " + std::to_string(d.device) + ", the worker runs on device " +
           std::to_string(device);
  if (d.size_bytes == 0 || d.size_bytes % granularity != 0)
    return what + ": size is not a multiple of the allocation granularity " +
           std::to_string(granularity);
  mapping m;
  m.size = d.size_bytes;
  CUresult r = cu.cuMemImportFromShareableHandle(
      &m.handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd.get())),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return "cuMemImportFromShareableHandle " + name(r) + " for " + what;
  // The host's address where it is free here, so pointers the host stored inside the buffer
  // stay meaningful; any address otherwise.
  r = cu.cuMemAddressReserve(&m.address, m.size, granularity, d.host_address, 0);
  if (r != CUDA_SUCCESS && d.host_address != 0)
    r = cu.cuMemAddressReserve(&m.address, m.size, granularity, 0, 0);
  if (r != CUDA_SUCCESS) {
    cu.cuMemRelease(m.handle);
    return "cuMemAddressReserve " + name(r) + " for " + what;
  }
  if (r = cu.cuMemMap(m.address, m.size, 0, m.handle, 0); r != CUDA_SUCCESS) {
    cu.cuMemAddressFree(m.address, m.size);
    cu.cuMemRelease(m.handle);
    return "cuMemMap " + name(r) + " for " + what;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (r = cu.cuMemSetAccess(m.address, m.size, &access, 1); r != CUDA_SUCCESS) {
    cu.cuMemUnmap(m.address, m.size);
    cu.cuMemAddressFree(m.address, m.size);
    cu.cuMemRelease(m.handle);
    return "cuMemSetAccess " + name(r) + " for " + what;
  }
  mappings_.emplace(d.id, m);
  return {};
}

void buffer_mappings::unmap(std::uint64_t id) {
  const auto it = mappings_.find(id);
  if (it == mappings_.end()) return;
  const auto& cu = cubridge::driver::api();
  cu.cuMemUnmap(it->second.address, it->second.size);
  cu.cuMemAddressFree(it->second.address, it->second.size);
  cu.cuMemRelease(it->second.handle);
  mappings_.erase(it);
}

const mapping* buffer_mappings::find(std::uint64_t id) const {
  const auto it = mappings_.find(id);
  return it == mappings_.end() ? nullptr : &it->second;
}

}  // namespace cubridge_worker
