#pragma once
/* The entry-point ABI of a library that runs in a cubridge sandbox worker (see sandbox.hpp).
 *
 * Plain C, so that a third-party library needs neither C++ nor cubridge to offer entry points.
 * It may link cubridge all the same: its own copy, apart from the worker's (docs/isolation.md,
 * "An entry library may use cubridge").
 * The worker dlopens the library and, for sandbox::call("name", ...), calls its exported
 *
 *     CUBRIDGE_SANDBOX_EXPORT int name(cubridge_sandbox_args* args);
 *
 * on the worker's main thread, with the device's primary context current (the context a
 * statically linked runtime then uses too). The return value goes back to the host as
 * sandbox_reply::status; cubridge gives it no meaning. A crash, abort(), a call that does not
 * return in time, or a sticky CUDA error left in the current context after the call ends the
 * worker: the host gets a sandbox_error and a fresh worker.
 */

#include <stddef.h>

#define CUBRIDGE_SANDBOX_ABI_VERSION 1

#ifdef __cplusplus
#define CUBRIDGE_SANDBOX_EXPORT extern "C" __attribute__((visibility("default")))
extern "C" {
#else
#define CUBRIDGE_SANDBOX_EXPORT __attribute__((visibility("default")))
#endif

/* A host buffer shared with the worker, mapped in the worker's address space: kernels the entry
 * launches read and write the host's memory in place (no copy). */
typedef struct cubridge_sandbox_buffer {
  void* data;        /* device address in the worker (the host's address where it was free) */
  size_t size_bytes; /* bytes mapped (the host allocation's size, granularity-rounded) */
} cubridge_sandbox_buffer;

/* Everything an entry gets. Valid only during the call. */
typedef struct cubridge_sandbox_args {
  size_t struct_size;  /* sizeof(cubridge_sandbox_args) of the worker: fields may be appended */
  int abi_version;     /* CUBRIDGE_SANDBOX_ABI_VERSION of the worker */
  int device;          /* CUDA device ordinal the worker runs on */
  const void* request; /* the host's request bytes */
  size_t request_bytes;
  const cubridge_sandbox_buffer* buffers; /* in the order the host passed them */
  size_t buffer_count;
  void* reply;           /* room for the reply bytes ... */
  size_t reply_capacity; /* ... this many */
  size_t reply_bytes;    /* set by the entry: bytes of reply used (clamped to reply_capacity) */
} cubridge_sandbox_args;

typedef int (*cubridge_sandbox_entry)(cubridge_sandbox_args* args);

#ifdef __cplusplus
}
#endif
