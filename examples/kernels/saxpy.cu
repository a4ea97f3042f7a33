// The kernel the runtime-first example loads through the Driver API.
#include <cstddef>
extern "C" __global__ void saxpy(float a, const float* x, float* y, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
