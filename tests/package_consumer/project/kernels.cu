// A consumer's CUDA file, compiled by nvcc as C++20 against the installed core headers: a
// <<<>>> kernel takes a device_span as T* and runs on a stream_ref. Built, and run only where
// there is a GPU.
#include <cubridge/core/device_span.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/stream_ref.hpp>

#include <cuda_runtime.h>

#include <cstdio>

static_assert(__cplusplus >= 202002L, "nvcc compiles this file as C++20");

__global__ void fill(unsigned* out, std::size_t size, unsigned value) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < size) out[i] = value;
}

int main() {
  if (!cubridge::driver::available()) {
    std::printf("cubridge consumer cuda: no GPU: %s\n",
                cubridge::driver::unavailable_reason().c_str());
    return 0;
  }
  unsigned* raw = nullptr;
  constexpr std::size_t size = 256;
  if (cudaMalloc(&raw, size * sizeof(unsigned)) != cudaSuccess) return 1;
  const cubridge::device_span<unsigned> span(raw, size);
  const auto stream = cubridge::stream_ref::legacy_default();
  fill<<<1, size, 0, stream.runtime_handle()>>>(span, span.size(), 7u);
  unsigned first = 0;
  const bool ok =
      cudaMemcpy(&first, span.data(), sizeof first, cudaMemcpyDeviceToHost) == cudaSuccess &&
      first == 7u;
  cudaFree(raw);
  std::printf("cubridge consumer cuda: kernel %s\n", ok ? "wrote 7" : "FAILED");
  return ok ? 0 : 1;
}
