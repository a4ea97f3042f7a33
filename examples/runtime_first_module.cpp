// Runtime first: the program (or a library it uses) already runs on the CUDA runtime; cubridge
// adopts the runtime's primary context and runs a driver-loaded kernel on cudaMalloc memory.
#include <cubridge/core/device_span.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/primary_context.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s saxpy.cubin\n", argv[0]);
    return 64;
  }
  if (!cubridge::driver::available()) {
    std::printf("runtime_first_module: no GPU: %s\n",
                cubridge::driver::unavailable_reason().c_str());
    return 77;  // skipped
  }
  const std::size_t n = 1 << 20;
  float *x = nullptr, *y = nullptr;  // the runtime's memory, in its primary context
  cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&y), n * sizeof(float));
  std::vector<float> hx(n), hy(n);
  for (std::size_t i = 0; i < n; ++i) hx[i] = float(i % 1000), hy[i] = 1.0f;
  cudaMemcpy(x, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(y, hy.data(), n * sizeof(float), cudaMemcpyHostToDevice);

  auto primary = cubridge::primary_context::adopt_runtime();
  auto module = cubridge::module::load_file(primary, argv[1]);
  auto saxpy = module.get_kernel("saxpy").typed<float, const float*, float*, std::size_t>();
  saxpy.launch({.grid = {unsigned((n + 255) / 256)},
                .block = {256},
                .stream = cubridge::stream_ref::legacy_default()},
               2.0f, x, y, n);
  cudaMemcpy(hy.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);  // syncs the legacy stream

  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += hy[i] != 2.0f * float(i % 1000) + 1.0f;
  std::printf("runtime_first_module: saxpy from %s in %s: %zu of %zu elements wrong\n",
              module.name().c_str(), primary.ref().describe().c_str(), wrong, n);
  cudaFree(x);
  cudaFree(y);
  return wrong == 0 ? 0 : 1;
}
