#pragma once
// The CUDA driver, loaded at run time: dlopen("libcuda.so.1") + cuGetProcAddress, each entry point
// resolved once and cached. Nothing in cubridge links -lcuda, so its tools start (and say so
// plainly) on machines without a GPU.

#include <cuda.h>
#include <cubridge/core/error.hpp>

#include <string>

namespace cubridge::driver {

// Every driver entry point cubridge calls. The names expand through cuda.h's version macros
// (cuCtxCreate -> cuCtxCreate_v4), so each pointer has the signature of the CUDA 13 ABI, and
// cuGetProcAddress is asked for the same ABI version (CUDA_VERSION).
// (kept by hand, one group of related entry points per line: clang-format would refill it)
// clang-format off
#define CUBRIDGE_DRIVER_ENTRY_POINTS(X)                                                         \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                         \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)                 \
  X(cuDeviceTotalMem) X(cuDeviceGetUuid)                                                        \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxGetState)        \
  X(cuDevicePrimaryCtxSetFlags) X(cuDevicePrimaryCtxReset)                                      \
  X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxSetCurrent)      \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxGetId) X(cuCtxSynchronize) X(cuCtxGetFlags)       \
  X(cuGreenCtxCreate) X(cuGreenCtxDestroy) X(cuCtxFromGreenCtx) X(cuDeviceGetDevResource)       \
  X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc) X(cuGreenCtxGetDevResource)       \
  X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost) X(cuMemcpy) X(cuMemcpyAsync)    \
  X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemGetInfo) X(cuPointerGetAttribute)                     \
  X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap)         \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity)                              \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamGetCtx)                 \
  X(cuStreamWaitEvent) X(cuStreamQuery) X(cuStreamGetCaptureInfo) X(cuStreamIsCapturing) X(cuStreamBeginCapture) X(cuStreamEndCapture)                           \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventQuery)     \
  X(cuEventElapsedTime)                                                                         \
  X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal)           \
  X(cuModuleGetLoadingMode) X(cuModuleGetFunctionCount) X(cuModuleEnumerateFunctions)           \
  X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuLibraryGetGlobal)           \
  X(cuLibraryGetKernelCount) X(cuLibraryEnumerateKernels) X(cuKernelGetName)                    \
  X(cuKernelGetFunction) X(cuKernelGetParamInfo) X(cuKernelGetAttribute)                        \
  X(cuFuncGetParamInfo) X(cuFuncGetAttribute) X(cuFuncGetName) X(cuFuncLoad) X(cuFuncIsLoaded)   \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuOccupancyMaxPotentialBlockSize)             \
  X(cuLaunchKernel) X(cuLaunchKernelEx)                                                          \
  X(cuGraphGetNodes) X(cuGraphNodeGetType) X(cuGraphAddKernelNode) X(cuGraphKernelNodeGetParams) \
  X(cuGraphKernelNodeSetParams) X(cuGraphExecKernelNodeSetParams) X(cuGraphLaunch)              \
  X(cuGraphCreate) X(cuGraphDestroy) X(cuGraphInstantiateWithFlags) X(cuGraphExecDestroy)     \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuMemsetD32)           \
  X(cuMemHostRegister) X(cuMemHostUnregister)                                                \
  X(cuMemGetAddressRange) X(cuMemcpyDtoD) X(cuMemcpyDtoDAsync) X(cuMemcpyDtoH)
// clang-format on

/// Cached pointers to the driver's entry points, one member per name above.
struct entry_points {
#define CUBRIDGE_DECLARE_ENTRY_POINT(name) decltype(&::name) name = nullptr;
  CUBRIDGE_DRIVER_ENTRY_POINTS(CUBRIDGE_DECLARE_ENTRY_POINT)
#undef CUBRIDGE_DECLARE_ENTRY_POINT
};

/// The driver's entry points; loads libcuda.so.1 and calls cuInit(0) on first use (thread-safe).
/// @throws driver_unavailable if libcuda.so.1 is missing, lacks an entry point, or cuInit fails
///         (e.g. CUDA_ERROR_NO_DEVICE on a machine with a driver but no GPU).
[[nodiscard]] const entry_points& api();

/// True when api() would succeed. Never throws.
[[nodiscard]] bool available() noexcept;

/// Why the driver is unavailable (empty when it is available). Never throws.
[[nodiscard]] std::string unavailable_reason() noexcept;

/// Path of the loaded libcuda (from dladdr), e.g. "/usr/lib/x86_64-linux-gnu/libcuda.so.1".
/// @throws driver_unavailable
[[nodiscard]] std::string library_path();

/// cuDriverGetVersion, e.g. 13000. @throws driver_unavailable
[[nodiscard]] int version();

}  // namespace cubridge::driver
