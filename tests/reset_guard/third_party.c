// A "third-party library" that resets the primary context the ways real libraries do: a direct
// call (linked against libcuda), dlsym on libcuda.so.1, cuGetProcAddress (as a statically linked
// cudart does, asking for cuDevicePrimaryCtxReset at version 7000), and from a thread it creates.
#define _GNU_SOURCE
#include <cuda.h>  // the real ABI: cuDevicePrimaryCtxReset expands to cuDevicePrimaryCtxReset_v2
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define THIRD_PARTY_EXPORT __attribute__((visibility("default")))

typedef CUresult (*reset_fn)(CUdevice);

// Each reset's result is stored before it is returned, so that the call is not compiled as a tail
// call: a tail call leaves no return address inside this library, and the guard (dladdr on its
// return address) would name this library's caller instead (a limit documented in the README).
static volatile int last_result;
static int keep(CUresult r) {
  last_result = (int)r;
  return last_result;
}
typedef CUresult (*get_proc_fn)(const char*, void**, int, cuuint64_t,
                                CUdriverProcAddressQueryResult*);

THIRD_PARTY_EXPORT int reset_direct(void) {
  return keep(cuDevicePrimaryCtxReset(0));
}

THIRD_PARTY_EXPORT int reset_via_dlsym(void) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == NULL) return -1;
  reset_fn reset = (reset_fn)dlsym(driver, "cuDevicePrimaryCtxReset_v2");
  return reset != NULL ? keep(reset(0)) : -2;
}

THIRD_PARTY_EXPORT int reset_via_proc_address(void) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == NULL) return -1;
  get_proc_fn get_proc = (get_proc_fn)dlsym(driver, "cuGetProcAddress_v2");
  if (get_proc == NULL) return -2;
  void* p = NULL;
  CUdriverProcAddressQueryResult status;
  CUresult r = get_proc("cuDevicePrimaryCtxReset", &p, 7000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || p == NULL) return -3;
  return keep(((reset_fn)p)(0));
}

static void* thread_main(void* arg) {
  *(int*)arg = reset_via_proc_address();
  return NULL;
}

THIRD_PARTY_EXPORT int reset_from_own_thread(void) {
  pthread_t thread;
  int result = -4;
  if (pthread_create(&thread, NULL, thread_main, &result) != 0) return -5;
  pthread_join(thread, NULL);
  return result;
}

static void* direct_thread_main(void* arg) {
  *(int*)arg = reset_direct();
  return NULL;
}

THIRD_PARTY_EXPORT int reset_direct_from_own_thread(void) {
  pthread_t thread;
  int result = -4;
  if (pthread_create(&thread, NULL, direct_thread_main, &result) != 0) return -5;
  pthread_join(thread, NULL);
  return result;
}
