// Kernels the GPU tests load through the Driver API (as cubin, PTX and fatbin).
#include <cstddef>

struct triple {
  double a, b, c;
};

extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void fill_u32(unsigned* out, unsigned value, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = value;
}

extern "C" __global__ void add_f32(float* data, float addend, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] += addend;
}

// Parameters of mixed sizes, to check the driver's parameter list: 8, 4, 1, 8, 24 bytes.
extern "C" __global__ void mixed_parameters(float* out, int i, char c, double d, triple t) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = static_cast<float>(i + c + d + t.a + t.b + t.c);
}

__device__ unsigned long long launch_counter;

extern "C" __global__ void count_launch() {
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(&launch_counter, 1ull);
}

template <class T>
__global__ void scale(T* data, T factor, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] *= factor;
}
template __global__ void scale<float>(float*, float, std::size_t);
