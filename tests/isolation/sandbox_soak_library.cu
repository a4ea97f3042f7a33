// The sandbox soak's CUDA library (nvcc, static cudart, the sandbox entry ABI): one working entry
// and one for each way a library ends its worker (crash, abort, fault, reset, hang).
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cuda_runtime.h>

#include <unistd.h>

#include <cstdlib>

namespace {

__global__ void add_one_kernel(unsigned* data, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] += 1;
}

__global__ void write_to(unsigned* where) {
  *where = 0xdead;
}

}  // namespace

// Adds 1 to every unsigned of buffers[0], in place.
CUBRIDGE_SANDBOX_EXPORT int soak_add_one(cubridge_sandbox_args* args) {
  if (args->buffer_count < 1) return cudaErrorInvalidValue;
  auto* data = static_cast<unsigned*>(args->buffers[0].data);
  const size_t n = args->buffers[0].size_bytes / sizeof(unsigned);
  add_one_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(data, n);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

// After a runtime call, so that a CUDA context is up in the worker when it dies.
CUBRIDGE_SANDBOX_EXPORT int soak_crash(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  volatile int* volatile nowhere = nullptr;
  *nowhere = 42;
  return 0;
}

CUBRIDGE_SANDBOX_EXPORT int soak_abort(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  std::abort();
}

CUBRIDGE_SANDBOX_EXPORT int soak_fault(cubridge_sandbox_args*) {
  write_to<<<1, 1>>>(reinterpret_cast<unsigned*>(0x10));
  return cudaDeviceSynchronize();
}

CUBRIDGE_SANDBOX_EXPORT int soak_reset(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  return cudaDeviceReset();
}

CUBRIDGE_SANDBOX_EXPORT int soak_hang(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  for (;;) pause();
}
