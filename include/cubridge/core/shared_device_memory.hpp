#pragma once
// Device memory shared by every context of a device, through the VMM API (cuMemCreate +
// cuMemAddressReserve + cuMemMap + cuMemSetAccess). Access is granted per device, which is the
// documented way to use one buffer from several contexts (FACTS.md: a buffer mapped while A was
// current was written in B and stayed valid after B was destroyed).

#include <cubridge/core/device.hpp>
#include <cubridge/core/device_span.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/unique_fd.hpp>

#include <cstddef>

namespace cubridge {

/// Whether an allocation can be handed to another process.
enum class memory_export {
  none,      ///< this process only
  posix_fd,  ///< exportable as a POSIX file descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
};

/// Owning, move-only VMM allocation of at least `bytes` (rounded up to the device's allocation
/// granularity), readable and writable from every context on the device. It belongs to no
/// context, so it outlives any of them.
///
/// Not an owning_handle<Traits>: that template owns one native handle with one release call,
/// and this owns three driver objects that are made and released as a unit, in order (the
/// physical allocation, the reserved address range, the mapping between them: unmap, free the
/// range, release). A failure between them releases what was made; no state in between is a
/// value a caller could hold.
class shared_device_memory {
 public:
  /// @throws error naming the device and the size (e.g. CUDA_ERROR_OUT_OF_MEMORY, or
  ///         CUDA_ERROR_NOT_SUPPORTED on a device without VMM).
  ///         With memory_export::posix_fd the allocation can later be exported with
  ///         export_fd() (CUDA_ERROR_NOT_SUPPORTED where the device cannot).
  [[nodiscard]] static shared_device_memory allocate(
      device dev, std::size_t bytes, memory_export exportable = memory_export::none);

  shared_device_memory(shared_device_memory&& other) noexcept;
  shared_device_memory& operator=(shared_device_memory&& other) noexcept;
  shared_device_memory(const shared_device_memory&) = delete;
  shared_device_memory& operator=(const shared_device_memory&) = delete;
  ~shared_device_memory();

  [[nodiscard]] CUdeviceptr address() const noexcept { return address_; }
  /// Bytes mapped (the request rounded up to the granularity).
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_; }
  [[nodiscard]] cubridge::device device() const noexcept { return device_; }
  /// The physical allocation handle (for export to other processes).
  [[nodiscard]] CUmemGenericAllocationHandle handle() const noexcept { return handle_; }
  /// How the allocation was made exportable.
  [[nodiscard]] memory_export exportable() const noexcept { return export_; }
  /// A new file descriptor for the allocation (cuMemExportToShareableHandle), which another
  /// process imports with cuMemImportFromShareableHandle (e.g. after passing it with SCM_RIGHTS).
  /// The physical memory lives until this allocation and every imported handle are released.
  /// @throws error (errc::precondition) unless allocated with memory_export::posix_fd;
  ///         error naming the allocation if the driver refuses.
  [[nodiscard]] unique_fd export_fd() const;
  /// A typed view of the first size_bytes() / sizeof(T) elements.
  template <class T>
  [[nodiscard]] device_span<T> span() const noexcept {
    return device_span<T>::from_native(address_, size_ / sizeof(T));
  }

 private:
  shared_device_memory(cubridge::device dev, CUmemGenericAllocationHandle handle,
                       CUdeviceptr address, std::size_t size, memory_export exportable) noexcept
      : device_(dev), handle_(handle), address_(address), size_(size), export_(exportable) {}
  void reset() noexcept;
  cubridge::device device_;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr address_ = 0;
  std::size_t size_ = 0;
  memory_export export_ = memory_export::none;
};

}  // namespace cubridge
