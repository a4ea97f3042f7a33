// The library the isolation benchmark runs in a guest context and in a sandbox worker (nvcc,
// static cudart, sandbox entry ABI): a no-op, a kernel on a shared buffer, the same through host
// memory, and one entry for each way a library ends its worker (crash, fault, reset, hang).
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
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

__global__ void write_to(unsigned* where) {
  *where = 0xdead;
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

// The failures (bench_isolation's BM_sandbox_failure): each after a runtime call, so that the
// library's CUDA state is up in the worker as it would be in a service.
CUBRIDGE_SANDBOX_EXPORT int bench_crash(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  volatile int* volatile nowhere = nullptr;
  *nowhere = 42;
  return 0;
}

CUBRIDGE_SANDBOX_EXPORT int bench_fault(cubridge_sandbox_args*) {
  write_to<<<1, 1>>>(reinterpret_cast<unsigned*>(0x10));
  return cudaDeviceSynchronize();
}

CUBRIDGE_SANDBOX_EXPORT int bench_reset(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  return cudaDeviceReset();
}

CUBRIDGE_SANDBOX_EXPORT int bench_hang(cubridge_sandbox_args*) {
  cudaFree(nullptr);
  for (;;) pause();
}
