// Kernels with known parameter lists; compiled at build time into cubin, fatbin and PTX
// fixtures for tests/test_image.cpp. Keep the signatures in sync with that test.
#include <cstdint>

struct blob24 {
  double a;
  double b;
  double c;
};  // 24 bytes, alignment 8

struct alignas(16) blob16 {
  float v[4];
};  // 16 bytes, alignment 16

// Sizes: 8, 4, 1, 8, 24
extern "C" __global__ void mixed_params(float* out, int n, char c, double d, blob24 s) {
  if (out != nullptr && n > 0) out[0] = static_cast<float>(c + d + s.a + s.b + s.c);
}

// No parameters.
extern "C" __global__ void no_params() {}

// Sizes: 2, 16, 8
extern "C" __global__ void aligned_params(short h, blob16 v, unsigned long long* out) {
  if (out != nullptr) out[0] = static_cast<unsigned long long>(h + v.v[0] + v.v[3]);
}

// A C++ (mangled) template kernel. Sizes: 8, 4
template <typename T>
__global__ void scale(T* data, T factor) {
  data[threadIdx.x] *= factor;
}
template __global__ void scale<float>(float*, float);

struct blob5000 {
  char bytes[5000];
};  // parameters over 4 KiB: ptxas writes no per-parameter records

// Sizes: 5000, 8 (recorded in PTX only)
extern "C" __global__ void big_params(blob5000 b, int* out) {
  if (out != nullptr) out[threadIdx.x] = b.bytes[threadIdx.x];
}

// A device function that is not a kernel; must not be reported.
__device__ __noinline__ int helper(int x) {
  return x * 3;
}
extern "C" __global__ void calls_helper(int* out) {
  out[threadIdx.x] = helper(threadIdx.x);
}
