#pragma once
// The host's buffers mapped in the worker: POSIX fds over SCM_RIGHTS ->
// cuMemImportFromShareableHandle -> cuMemAddressReserve (at the host's address where that range
// is free) -> cuMemMap -> cuMemSetAccess, by share id, until unmapped.

#include <cubridge/core/driver.hpp>
#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace cubridge_worker {

/// One host buffer mapped here.
struct mapping {
  CUdeviceptr address = 0;
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
};

class buffer_mappings {
 public:
  /// Maps `d` from `fd` on `device` (granularity: the device's minimum for exportable memory).
  /// Returns "" (also when it is mapped already; a re-sent fd is simply closed) or why not.
  std::string map(const cubridge::detail::sandbox_protocol::buffer_descriptor& d,
                  cubridge::unique_fd fd, int device, std::size_t granularity);
  /// Unmaps buffer `id`; nothing if it is not mapped.
  void unmap(std::uint64_t id);
  /// The mapping of buffer `id`, or nullptr.
  [[nodiscard]] const mapping* find(std::uint64_t id) const;

 private:
  std::map<std::uint64_t, mapping> mappings_;
};

}  // namespace cubridge_worker
