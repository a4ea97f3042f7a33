// A fake CUDA driver for the reset-guard tests on machines without a GPU. Built as libcuda.so.1
// (SONAME too) into a directory of its own; it exports what the guard and the test library use,
// with the ABI of cuda.h, and counts resets and synchronizations.
// FAKE_CUDA_CURRENT_CONTEXT=1 makes cuCtxGetCurrent report a current context.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver_abi.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

static int reset_count;
static int sync_count;

FAKE_EXPORT int fake_reset_count(void) {
  return __atomic_load_n(&reset_count, __ATOMIC_SEQ_CST);
}
FAKE_EXPORT int fake_sync_count(void) {
  return __atomic_load_n(&sync_count, __ATOMIC_SEQ_CST);
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  (void)dev;
  __atomic_add_fetch(&reset_count, 1, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  (void)dev;
  __atomic_add_fetch(&reset_count, 1, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  static char fake_context;
  const char* env = getenv("FAKE_CUDA_CURRENT_CONTEXT");
  *ctx = env != NULL && strcmp(env, "1") == 0 ? (CUcontext)(void*)&fake_context : NULL;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxSynchronize(void) {
  __atomic_add_fetch(&sync_count, 1, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  (void)flags;
  void* p = NULL;
  if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0)
    p = cuda_version >= 11000 ? (void*)&cuDevicePrimaryCtxReset_v2
                              : (void*)&cuDevicePrimaryCtxReset;
  else if (strcmp(symbol, "cuCtxGetCurrent") == 0)
    p = (void*)&cuCtxGetCurrent;
  else if (strcmp(symbol, "cuCtxSynchronize") == 0)
    p = (void*)&cuCtxSynchronize;
  else if (strcmp(symbol, "cuGetProcAddress") == 0 && cuda_version >= 12000)
    p = (void*)&cuGetProcAddress_v2;
  *pfn = p;
  if (status != NULL)
    *status = p != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
