// Versions of one module for the hot-swap tests, built with -DVERSION=N and variants:
//   -DDROP_SPIN       a version that lacks a kernel of the interface
//   -DCHANGED_PARAMS  a version whose write_version takes another parameter
//   -DSMALL_BLOCKS    a version whose write_version allows at most 128 threads per block
#ifndef VERSION
#define VERSION 1
#endif

// State a service keeps on the GPU, carried from version to version on request.
__device__ unsigned long long served = 0;

extern "C" __global__ void count_served() {
  if (threadIdx.x == 0 && blockIdx.x == 0) served += VERSION;
}

#ifdef CHANGED_PARAMS
extern "C" __global__ void write_version(unsigned* out, int unused) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = VERSION + unused * 0;
}
#elif defined(SMALL_BLOCKS)
extern "C" __global__ void __launch_bounds__(128) write_version(unsigned* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = VERSION;
}
#else
extern "C" __global__ void write_version(unsigned* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = VERSION;
}
#endif

#ifndef DROP_SPIN
__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Runs for about `ns` nanoseconds, then writes the version: work still in flight at a swap.
extern "C" __global__ void spin_then_write(unsigned* out, unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = VERSION;
}
#endif
