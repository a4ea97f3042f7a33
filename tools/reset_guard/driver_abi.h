// The few driver types the reset guard (and the fake driver its tests use) need, declared here
// rather than taken from cuda.h, whose macros rename the very functions these files define
// (cuDevicePrimaryCtxReset -> cuDevicePrimaryCtxReset_v2). Same ABI as cuda.h.
#ifndef CUBRIDGE_RESET_GUARD_DRIVER_ABI_H
#define CUBRIDGE_RESET_GUARD_DRIVER_ABI_H

#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef uint64_t cuuint64_t;
typedef int CUdriverProcAddressQueryResult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_FOUND = 500 };
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1 };

#endif
