// A "vendor" library as nvcc builds it (runtime API, static cudart), with the habits that make
// third-party CUDA code dangerous to its host: it resets the device when it is done, and one of
// its functions has a bug that writes to an invalid address. Its entry points use the sandbox
// ABI (cubridge/isolation/sandbox_entry.hpp), so the same library runs in a guest context or a
// sandbox.
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cuda_runtime.h>

__global__ static void add_one(float* data, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] += 1.0f;
}

__global__ static void buggy(float* data) {
  data[1ull << 40] = 0.0f;
}

// Adds 1 to every float of buffers[0].
CUBRIDGE_SANDBOX_EXPORT int vendor_add_one(cubridge_sandbox_args* args) {
  if (args->buffer_count < 1) return cudaErrorInvalidValue;
  auto* data = static_cast<float*>(args->buffers[0].data);
  const size_t n = args->buffers[0].size_bytes / sizeof(float);
  add_one<<<static_cast<unsigned>((n + 255) / 256), 256>>>(data, n);
  return cudaDeviceSynchronize();
}

// "Cleans up" the way too many libraries do: resets the device.
CUBRIDGE_SANDBOX_EXPORT int vendor_finish(cubridge_sandbox_args*) {
  return cudaDeviceReset();
}

// Writes far past its buffer: CUDA_ERROR_ILLEGAL_ADDRESS, which poisons the whole process.
CUBRIDGE_SANDBOX_EXPORT int vendor_buggy(cubridge_sandbox_args* args) {
  if (args->buffer_count < 1) return cudaErrorInvalidValue;
  buggy<<<1, 1>>>(static_cast<float*>(args->buffers[0].data));
  return cudaDeviceSynchronize();
}
