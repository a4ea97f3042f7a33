// The serving kernel of the swap-under-load harness (swap_under_load.cpp), built once per
// version with -DVERSION=N (N >= 1) into sm_90 cubins (what hot_module stages) and compute_90
// PTX (what the naive reference hands the driver's JIT). Every version has the same interface.
#ifndef VERSION
#define VERSION 1
#endif

// One log slot; hotswap::gpu_record (stats.hpp) mirrors it.
struct record {
  unsigned long long tag;       // VERSION of the image that ran
  unsigned long long start_ns;  // %globaltimer when block 0 thread 0 began
  unsigned long long end_ns;    // %globaltimer when it finished spinning
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Emulates ~spin_ns of work in every thread, then block 0 thread 0 writes its record to
// log[slot] (the host hands each launch its own slot).
extern "C" __global__ void serve(record* log, unsigned long long slot, unsigned long long spin_ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < spin_ns) {
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned long long end = global_ns();
    log[slot] = record{VERSION, start, end};
  }
}

// Clock calibration: one read of %globaltimer.
extern "C" __global__ void stamp(unsigned long long* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = global_ns();
}
