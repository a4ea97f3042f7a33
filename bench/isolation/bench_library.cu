// The library the isolation benchmark runs in a guest context and in a sandbox worker (nvcc,
// static cudart, sandbox entry ABI).
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace {
__global__ void add_one(float* data, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] += 1.0f;
}

int add_one_on(float* data, size_t n) {
  add_one<<<static_cast<unsigned>((n + 255) / 256), 256>>>(data, n);
  return cudaDeviceSynchronize();
}
}  // namespace

CUBRIDGE_SANDBOX_EXPORT int bench_noop(cubridge_sandbox_args* args) {
  args->reply_bytes = 0;
  return 0;
}

// In place, on the host's buffer mapped in the worker.
CUBRIDGE_SANDBOX_EXPORT int bench_add_one(cubridge_sandbox_args* args) {
  if (args->buffer_count < 1) return cudaErrorInvalidValue;
  return add_one_on(static_cast<float*>(args->buffers[0].data),
                    args->buffers[0].size_bytes / sizeof(float));
}

// Without shared device memory: the data comes through host memory (a POSIX shared-memory object
// named by the request, pinned on both sides) into the worker's own device buffer and back.
CUBRIDGE_SANDBOX_EXPORT int bench_add_one_staged(cubridge_sandbox_args* args) {
  static std::string name;
  static void* host = nullptr;
  static float* device = nullptr;
  static size_t bytes = 0;
  const std::string requested(static_cast<const char*>(args->request), args->request_bytes);
  const size_t sep = requested.find(':');
  if (sep == std::string::npos) return cudaErrorInvalidValue;
  if (requested.substr(0, sep) != name) {
    name = requested.substr(0, sep);
    bytes = std::stoull(requested.substr(sep + 1));
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return cudaErrorInvalidValue;
    host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (host == MAP_FAILED) return cudaErrorInvalidValue;
    if (const cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterDefault);
        e != cudaSuccess)
      return e;
    if (const cudaError_t e = cudaMalloc(&device, bytes); e != cudaSuccess) return e;
  }
  if (const cudaError_t e = cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
      e != cudaSuccess)
    return e;
  if (const int e = add_one_on(device, bytes / sizeof(float)); e != 0) return e;
  return cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost);
}
