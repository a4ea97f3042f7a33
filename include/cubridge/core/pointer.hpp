#pragma once
// Questions about an address: which context owns it, what kind of memory it is.

#include <cubridge/core/context_ref.hpp>

#include <cuda.h>

namespace cubridge {

/// Kind of memory behind an address (CU_POINTER_ATTRIBUTE_MEMORY_TYPE).
enum class memory_kind { unregistered_host, host, device, array, managed };

/// The context that allocated `pointer` (CU_POINTER_ATTRIBUTE_CONTEXT). Null for VMM memory,
/// which belongs to no context. @throws error naming the address if the driver does not know it.
[[nodiscard]] context_ref context_of(const void* pointer);
/// The kind of memory behind `pointer`; unregistered_host for plain host memory. Never throws
/// for a valid driver.
[[nodiscard]] memory_kind memory_kind_of(const void* pointer);

}  // namespace cubridge
