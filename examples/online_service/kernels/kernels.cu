// The online service's hot module `kernels`. Built at build time with nvcc -DVERSION=1 (the
// version the service starts with); the demo pushes this same source with VERSION 2 defined
// first, compiled by `cubridge push` with NVRTC. No includes, so NVRTC needs no headers.
// -DBROKEN builds a version whose answers are wrong: the service's smoke test refuses it.
// -DWRONG_SOMETIMES builds one that is wrong only for inputs of 990 and up (1% of the load
// client's requests, none of the smoke test's inputs): it passes the smoke test and needs the
// service's own output check, as a health probe, to be caught.
// -DFAULT_SOMETIMES builds one that writes to an illegal address for the input 500 alone (1 in
// 1,000 of the load client's requests, none of the smoke test's inputs, which stay below 128)
// and is right otherwise: it passes the smoke test and poisons the process that serves it,
// unless probation (scripts/demo --bad-versions) finds the fault in a sandbox worker first.
#ifndef VERSION
#define VERSION 1
#endif

// out[i] = 2 * in[i] + 1 in every version (the service checks it); version_out says which ran.
extern "C" __global__ void respond(float* out, const float* in, unsigned n, unsigned* version_out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
#if defined(BROKEN)
  if (i < n) out[i] = 2.0f * in[i];
#elif defined(WRONG_SOMETIMES)
  if (i < n) out[i] = 2.0f * in[i] + (in[i] >= 990.0f ? 101.0f : 1.0f);
#elif defined(FAULT_SOMETIMES)
  // An address nobody mapped (as tests/swap/test_probation.cpp's faulting candidate writes):
  // CUDA_ERROR_ILLEGAL_ADDRESS, sticky.
  if (i == 0 && n > 0 && in[0] == 500.0f) *(volatile float*)(0x10) = 1.0f;
  if (i < n) out[i] = 2.0f * in[i] + 1.0f;
#else
  if (i < n) out[i] = 2.0f * in[i] + 1.0f;
#endif
  if (i == 0) *version_out = VERSION;
}
