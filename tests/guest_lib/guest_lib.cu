// A third-party library as nvcc builds it by default (runtime API, static cudart), with entry
// points in the sandbox ABI (sandbox_entry.hpp) so that one library is tested under every
// protection: called directly (none), inside a guest context, and in a sandbox worker. Each
// returns the cudaError_t of what it did (0: success).
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cuda_runtime.h>

#include <unistd.h>
#include <cstdlib>
#include <thread>

namespace {

__global__ void add_one_kernel(unsigned* data, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] += 1;
}

__global__ void write_to(unsigned* where) {
  *where = 0xdead;
}

}  // namespace

// Initialises the library's runtime in whatever context is current (a guest's, the primary).
CUBRIDGE_SANDBOX_EXPORT int guest_init(cubridge_sandbox_args*) {
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, 256); e != cudaSuccess) return e;
  return cudaFree(p);
}

// (a) resets the device from the caller's thread, as libraries do "to clean up".
CUBRIDGE_SANDBOX_EXPORT int guest_reset(cubridge_sandbox_args*) {
  return cudaDeviceReset();
}

// (b) resets from a thread of its own, where no context of the caller's is current.
CUBRIDGE_SANDBOX_EXPORT int guest_reset_from_own_thread(cubridge_sandbox_args*) {
  int result = -1;
  // The thread works on the device first, as a library's worker would: a reset from a thread
  // that made no runtime call leaves the primary context alone (measured on the H200).
  std::thread worker([&] {
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return;
    result = cudaDeviceReset();
  });
  worker.join();
  return result;
}

// (c) a kernel writes to an address nobody mapped: CUDA_ERROR_ILLEGAL_ADDRESS, sticky.
CUBRIDGE_SANDBOX_EXPORT int guest_write_invalid_address(cubridge_sandbox_args*) {
  write_to<<<1, 1>>>(reinterpret_cast<unsigned*>(0x10));
  return cudaDeviceSynchronize();
}

// (d)
CUBRIDGE_SANDBOX_EXPORT int guest_abort(cubridge_sandbox_args*) {
  std::abort();
}

// (e)
CUBRIDGE_SANDBOX_EXPORT int guest_hang(cubridge_sandbox_args*) {
  for (;;) pause();
}

// (f) adds 1 to every unsigned of buffers[0], in place.
CUBRIDGE_SANDBOX_EXPORT int guest_add_one(cubridge_sandbox_args* args) {
  if (args->buffer_count < 1) return cudaErrorInvalidValue;
  auto* data = static_cast<unsigned*>(args->buffers[0].data);
  const size_t n = args->buffers[0].size_bytes / sizeof(unsigned);
  add_one_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(data, n);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}
