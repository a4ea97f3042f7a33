// The online service's hot module `kernels`. Built at build time with nvcc -DVERSION=1 (the
// version the service starts with); the demo pushes this same source with VERSION 2 defined
// first, compiled by `cubridge push` with NVRTC. No includes, so NVRTC needs no headers.
// -DBROKEN builds a version whose answers are wrong: the service's smoke test refuses it.
#ifndef VERSION
#define VERSION 1
#endif

// out[i] = 2 * in[i] + 1 in every version (the service checks it); version_out says which ran.
extern "C" __global__ void respond(float* out, const float* in, unsigned n, unsigned* version_out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
#ifdef BROKEN
  if (i < n) out[i] = 2.0f * in[i];
#else
  if (i < n) out[i] = 2.0f * in[i] + 1.0f;
#endif
  if (i == 0) *version_out = VERSION;
}
