// A third-party library as nvcc builds it by default (static cudart): it initialises its own
// runtime, then resets the device the way misbehaving libraries do, from its own call or from
// a thread it created.
#include <cuda_runtime.h>

#include <thread>

extern "C" __attribute__((visibility("default"))) int third_party_init() {
  float* p = nullptr;
  if (cudaMalloc(&p, 256) != cudaSuccess) return 1;
  return cudaFree(p) == cudaSuccess ? 0 : 1;
}

extern "C" __attribute__((visibility("default"))) int third_party_reset() {
  return static_cast<int>(cudaDeviceReset());
}

extern "C" __attribute__((visibility("default"))) int third_party_reset_from_own_thread() {
  int result = -1;
  // The library's thread works on the device first (as a real worker would), then resets.
  std::thread worker([&] {
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return;
    result = static_cast<int>(cudaDeviceReset());
  });
  worker.join();
  return result;
}
