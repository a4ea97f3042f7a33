// cubridge reset guard: an LD_PRELOAD library that intercepts the CUDA driver's primary-context
// reset (cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2) however a caller reaches it:
//   1. a direct call (the guard exports both names, so it comes first in symbol lookup);
//   2. dlsym(handle, "cuDevicePrimaryCtxReset[_v2]" | "cuGetProcAddress[_v2]") (the guard
//      overrides dlsym and hands out its own wrappers);
//   3. cuGetProcAddress[_v2] (how a statically linked cudart gets every entry point; the guard's
//      wrapper calls the real one and replaces a reset entry point by the guard's stub).
// Policy from CUBRIDGE_RESET_POLICY: deny (default), log, allow. See README.md.
//
// Written in C on purpose: no C++ runtime, no exceptions, no static constructors. All state is
// trivially initialised (atomics set once, pthread_once), so it is safe to call from any thread
// and at any point of process start-up. Links only libdl and libpthread (both in libc today).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "driver_abi.h"

typedef CUresult (*reset_fn)(CUdevice);
typedef CUresult (*get_proc_v1_fn)(const char*, void**, int, cuuint64_t);
typedef CUresult (*get_proc_v2_fn)(const char*, void**, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult*);
typedef CUresult (*ctx_get_current_fn)(CUcontext*);
typedef CUresult (*ctx_synchronize_fn)(void);
typedef void* (*dlsym_fn)(void*, const char*);

#define GUARD_EXPORT __attribute__((visibility("default"), noinline))

GUARD_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev);
GUARD_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
GUARD_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                       cuuint64_t flags);
GUARD_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                          cuuint64_t flags, CUdriverProcAddressQueryResult* status);
GUARD_EXPORT void* dlsym(void* handle, const char* symbol);
// How a process tells that the guard is loaded, and with which policy (cubridge/core/
// reset_guard_status.hpp looks it up by name): "deny", "log" or "allow".
GUARD_EXPORT const char* cubridge_reset_guard_policy(void);

// ---------------------------------------------------------------------------------------------
// State: the real driver entry points behind each wrapper (set when first seen), read atomically.
enum slot { SLOT_RESET_V1, SLOT_RESET_V2, SLOT_GET_PROC_V1, SLOT_GET_PROC_V2, SLOT_COUNT };
static const char* const slot_names[SLOT_COUNT] = {"cuDevicePrimaryCtxReset",
                                                   "cuDevicePrimaryCtxReset_v2", "cuGetProcAddress",
                                                   "cuGetProcAddress_v2"};
static void* real_slots[SLOT_COUNT];  // written with __atomic_store_n only

static void* slot_wrapper(enum slot s) {
  switch (s) {
    case SLOT_RESET_V1:
      return (void*)&cuDevicePrimaryCtxReset;
    case SLOT_RESET_V2:
      return (void*)&cuDevicePrimaryCtxReset_v2;
    case SLOT_GET_PROC_V1:
      return (void*)&cuGetProcAddress;
    case SLOT_GET_PROC_V2:
      return (void*)&cuGetProcAddress_v2;
    default:
      return NULL;
  }
}

static int is_wrapper(void* p) {
  for (int s = 0; s < SLOT_COUNT; ++s)
    if (p == slot_wrapper((enum slot)s)) return 1;
  return 0;
}

static void remember_real(enum slot s, void* real) {
  if (real != NULL && !is_wrapper(real)) __atomic_store_n(&real_slots[s], real, __ATOMIC_RELEASE);
}

// ---------------------------------------------------------------------------------------------
// The real dlsym. dlvsym is not overridden, so finding it cannot recurse.
static dlsym_fn real_dlsym_ptr;
static pthread_once_t real_dlsym_once = PTHREAD_ONCE_INIT;
static void find_real_dlsym(void) {
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == NULL) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  real_dlsym_ptr = (dlsym_fn)p;
}
static dlsym_fn real_dlsym(void) {
  pthread_once(&real_dlsym_once, find_real_dlsym);
  return real_dlsym_ptr;
}

// ---------------------------------------------------------------------------------------------
// Policy and log destination, read once.
enum policy { POLICY_DENY, POLICY_LOG, POLICY_ALLOW };
static enum policy policy_value = POLICY_DENY;
static int policy_unknown;  // CUBRIDGE_RESET_POLICY had a value we do not know: treated as deny
static int log_fd = STDERR_FILENO;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static void read_config(void) {
  const char* p = getenv("CUBRIDGE_RESET_POLICY");
  if (p == NULL || *p == '\0' || strcmp(p, "deny") == 0) {
    policy_value = POLICY_DENY;
  } else if (strcmp(p, "log") == 0) {
    policy_value = POLICY_LOG;
  } else if (strcmp(p, "allow") == 0) {
    policy_value = POLICY_ALLOW;
  } else {
    policy_value = POLICY_DENY;
    policy_unknown = 1;
  }
  const char* file = getenv("CUBRIDGE_RESET_LOG");
  if (file != NULL && *file != '\0') {
    int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) log_fd = fd;  // else: stay on stderr
  }
}
static enum policy current_policy(void) {
  pthread_once(&config_once, read_config);
  return policy_value;
}

const char* cubridge_reset_guard_policy(void) {
  switch (current_policy()) {
    case POLICY_LOG:
      return "log";
    case POLICY_ALLOW:
      return "allow";
    case POLICY_DENY:
      break;
  }
  return "deny";
}

// One line, one write(): lines from concurrent threads do not interleave (O_APPEND for files).
__attribute__((format(printf, 1, 2))) static void log_line(const char* format, ...) {
  char line[1024];
  va_list args;
  va_start(args, format);
  int n = vsnprintf(line, sizeof line - 1, format, args);
  va_end(args);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  int saved_errno = errno;
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(log_fd, line + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += w;
  }
  errno = saved_errno;
}

// ---------------------------------------------------------------------------------------------
// The driver library, for the real entry points when no wrapper has seen them yet, and for
// cuCtxGetCurrent/cuCtxSynchronize (deny). Never loads libcuda unless a reset is to be forwarded.
static void* driver_handle(int may_load) {
  static void* handle;  // set once; a racing second dlopen only bumps a reference count
  void* h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
  if (h != NULL) return h;
  h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h == NULL && may_load) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h != NULL) __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
  return h;
}

static void* real_entry(enum slot s, int may_load) {
  void* p = __atomic_load_n(&real_slots[s], __ATOMIC_ACQUIRE);
  if (p != NULL) return p;
  dlsym_fn next = real_dlsym();
  if (next == NULL) return NULL;
  p = next(RTLD_NEXT, slot_names[s]);  // the definition after the guard: the driver's
  if (p == NULL || is_wrapper(p)) {
    void* h = driver_handle(may_load);
    p = h != NULL ? next(h, slot_names[s]) : NULL;
  }
  if (p == NULL || is_wrapper(p)) return NULL;
  remember_real(s, p);
  return p;
}

// ---------------------------------------------------------------------------------------------
// The reset itself.
static void describe_caller(const void* ret, char* out, size_t size) {
  Dl_info info;
  if (ret != NULL && dladdr(ret, &info) != 0 && info.dli_fname != NULL) {
    if (info.dli_sname != NULL)
      snprintf(out, size, "%s (%s+0x%lx)", info.dli_fname, info.dli_sname,
               (unsigned long)((const char*)ret - (const char*)info.dli_saddr));
    else
      snprintf(out, size, "%s (+0x%lx)", info.dli_fname,
               (unsigned long)((const char*)ret - (const char*)info.dli_fbase));
  } else {
    snprintf(out, size, "unknown (%p)", ret);
  }
}

static CUresult guarded_reset(enum slot s, CUdevice dev, const void* caller) {
  enum policy policy = current_policy();
  long tid = (long)syscall(SYS_gettid);
  char who[512];
  if (policy != POLICY_ALLOW) describe_caller(caller, who, sizeof who);
  if (policy == POLICY_DENY) {
    // Do what a reset would have waited for, without destroying anything: synchronize the
    // context current on this thread, if any. Without a current context there is nothing this
    // thread could synchronize (no context is created just for that).
    const char* sync = "no current context, nothing synchronized";
    void* h = driver_handle(0);
    dlsym_fn next = real_dlsym();
    if (h != NULL && next != NULL) {
      ctx_get_current_fn get_current = (ctx_get_current_fn)next(h, "cuCtxGetCurrent");
      ctx_synchronize_fn synchronize = (ctx_synchronize_fn)next(h, "cuCtxSynchronize");
      CUcontext ctx = NULL;
      if (get_current != NULL && synchronize != NULL && get_current(&ctx) == CUDA_SUCCESS &&
          ctx != NULL) {
        CUresult r = synchronize();
        sync = r == CUDA_SUCCESS ? "current context synchronized"
                                 : "current context synchronized with an error (ignored)";
      }
    }
    log_line(
        "cubridge-reset-guard: policy=deny%s call=%s device=%d tid=%ld caller=%s: "
        "reset skipped, %s, returning CUDA_SUCCESS",
        policy_unknown ? " (unknown CUBRIDGE_RESET_POLICY)" : "", slot_names[s], dev, tid, who,
        sync);
    return CUDA_SUCCESS;
  }
  reset_fn real = (reset_fn)real_entry(s, 1);
  if (real == NULL)
    real = (reset_fn)real_entry(s == SLOT_RESET_V1 ? SLOT_RESET_V2 : SLOT_RESET_V1, 1);
  if (policy == POLICY_LOG)
    log_line("cubridge-reset-guard: policy=log call=%s device=%d tid=%ld caller=%s: %s",
             slot_names[s], dev, tid, who,
             real != NULL ? "resetting" : "driver not found, CUDA_ERROR_NOT_FOUND");
  return real != NULL ? real(dev) : CUDA_ERROR_NOT_FOUND;
}

// The exported wrappers: the return address is the caller's, whichever way it got the pointer.
CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return guarded_reset(SLOT_RESET_V1, dev, __builtin_return_address(0));
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return guarded_reset(SLOT_RESET_V2, dev, __builtin_return_address(0));
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress: whatever the real one hands out for a reset (or for cuGetProcAddress itself)
// is kept, and the guard's wrapper is handed out instead.
static void substitute(const char* symbol, void** pfn, int cuda_version) {
  if (symbol == NULL || pfn == NULL || *pfn == NULL || is_wrapper(*pfn)) return;
  enum slot s;
  if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0)
    s = cuda_version >= 11000 ? SLOT_RESET_V2 : SLOT_RESET_V1;  // _v2 arrived in CUDA 11.0
  else if (strcmp(symbol, "cuDevicePrimaryCtxReset_v2") == 0)
    s = SLOT_RESET_V2;
  else if (strcmp(symbol, "cuGetProcAddress") == 0)
    s = cuda_version >= 12000 ? SLOT_GET_PROC_V2 : SLOT_GET_PROC_V1;  // _v2 arrived in 12.0
  else if (strcmp(symbol, "cuGetProcAddress_v2") == 0)
    s = SLOT_GET_PROC_V2;
  else
    return;
  remember_real(s, *pfn);
  *pfn = slot_wrapper(s);
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  get_proc_v1_fn real = (get_proc_v1_fn)real_entry(SLOT_GET_PROC_V1, 0);
  if (real == NULL) return CUDA_ERROR_NOT_FOUND;
  CUresult r = real(symbol, pfn, cuda_version, flags);
  if (r == CUDA_SUCCESS) substitute(symbol, pfn, cuda_version);
  return r;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  get_proc_v2_fn real = (get_proc_v2_fn)real_entry(SLOT_GET_PROC_V2, 0);
  if (real == NULL) return CUDA_ERROR_NOT_FOUND;
  CUresult r = real(symbol, pfn, cuda_version, flags, status);
  if (r == CUDA_SUCCESS) substitute(symbol, pfn, cuda_version);
  return r;
}

// ---------------------------------------------------------------------------------------------
// dlsym. glibc's dlsym resolves RTLD_NEXT (and the namespace of RTLD_DEFAULT) relative to the
// address it returns to; if the guard called it, another interposer's dlsym(RTLD_NEXT, "getenv")
// would find its own getenv again and recurse. So the guard's dlsym does not call the real one:
// it picks a target and *jumps* to it with the caller's return address still on the stack, the
// real dlsym for every other name, intercepted_dlsym (same signature) for the four names the guard
// replaces.
// The slot that `symbol` names exactly, or -1.
static int slot_of(const char* symbol) {
  for (int s = 0; s < SLOT_COUNT; ++s)
    if (strcmp(symbol, slot_names[s]) == 0) return s;
  return -1;
}

static void* intercepted_dlsym(void* handle, const char* symbol) {
  dlsym_fn next = real_dlsym();
  if (next == NULL) return NULL;
  // RTLD_NEXT from the guard: the definition after the guard, i.e. the driver's (the guard is
  // preloaded, and only it and the driver define these names).
  void* p = next(handle, symbol);
  if (p == NULL || is_wrapper(p)) return p;
  const int s = slot_of(symbol);
  if (s < 0) return p;
  remember_real((enum slot)s, p);
  return slot_wrapper((enum slot)s);
}

// Called by the trampoline: which function the caller's dlsym call continues in.
__attribute__((used, visibility("hidden"))) dlsym_fn cubridge_reset_guard_dlsym_target(
    void* handle, const char* symbol) {
  (void)handle;
  if (symbol != NULL && slot_of(symbol) >= 0) return intercepted_dlsym;
  dlsym_fn next = real_dlsym();
  return next != NULL ? next : intercepted_dlsym;  // no real dlsym: intercepted_dlsym says NULL
}

#if defined(__x86_64__)
__attribute__((naked)) void* dlsym(void* handle, const char* symbol) {
  (void)handle;
  (void)symbol;
  __asm__ volatile(
#if defined(__CET__)
      "endbr64\n\t"
#endif
      "push %rdi\n\t"
      "push %rsi\n\t"
      "sub $8, %rsp\n\t"  // 16-byte alignment at the call
      "call cubridge_reset_guard_dlsym_target\n\t"
      "add $8, %rsp\n\t"
      "pop %rsi\n\t"
      "pop %rdi\n\t"
      "jmp *%rax\n\t");
}
#elif defined(__aarch64__)
__attribute__((naked)) void* dlsym(void* handle, const char* symbol) {
  (void)handle;
  (void)symbol;
  __asm__ volatile(
      "stp x29, x30, [sp, #-32]!\n\t"
      "mov x29, sp\n\t"
      "stp x0, x1, [sp, #16]\n\t"
      "bl cubridge_reset_guard_dlsym_target\n\t"
      "mov x16, x0\n\t"
      "ldp x0, x1, [sp, #16]\n\t"
      "ldp x29, x30, [sp], #32\n\t"
      "br x16\n\t");
}
#else
// Elsewhere a plain call: RTLD_NEXT lookups of other code then start after the guard (README).
void* dlsym(void* handle, const char* symbol) {
  return cubridge_reset_guard_dlsym_target(handle, symbol)(handle, symbol);
}
#endif
