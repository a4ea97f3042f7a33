// pointer.hpp: what the driver knows of a pointer (cuPointerGetAttribute).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/pointer.hpp>

#include <source_location>

namespace cubridge {

namespace {
CUdeviceptr as_address(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}
}  // namespace

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

}  // namespace cubridge
