/* A library for the sandbox's CPU tests: entry points (sandbox_entry.hpp) that behave and
 * misbehave without touching CUDA, so worker crash, abort, hang and exit detection run anywhere. */
#include <cubridge/isolation/sandbox_entry.hpp>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Copies the request into the reply; returns the request's size. */
CUBRIDGE_SANDBOX_EXPORT int echo(cubridge_sandbox_args* args) {
  size_t n =
      args->request_bytes < args->reply_capacity ? args->request_bytes : args->reply_capacity;
  memcpy(args->reply, args->request, n);
  args->reply_bytes = n;
  return (int)args->request_bytes;
}

/* Returns how often it was called in this worker: a restart starts again at 1. */
CUBRIDGE_SANDBOX_EXPORT int count_calls(cubridge_sandbox_args* args) {
  static int calls = 0;
  (void)args;
  return ++calls;
}

/* Writes through a null pointer: SIGSEGV. */
CUBRIDGE_SANDBOX_EXPORT int crash(cubridge_sandbox_args* args) {
  volatile int* volatile nowhere = NULL;
  (void)args;
  *nowhere = 42;
  return 0;
}

CUBRIDGE_SANDBOX_EXPORT int do_abort(cubridge_sandbox_args* args) {
  (void)args;
  abort();
}

/* Never returns. */
CUBRIDGE_SANDBOX_EXPORT int hang(cubridge_sandbox_args* args) {
  (void)args;
  for (;;) pause();
}

/* Ends the process the way a library calling exit() does. */
CUBRIDGE_SANDBOX_EXPORT int exit_early(cubridge_sandbox_args* args) {
  (void)args;
  exit(3);
}

/* Claims more reply bytes than it has room for: the worker must clamp. */
CUBRIDGE_SANDBOX_EXPORT int overclaim_reply(cubridge_sandbox_args* args) {
  memset(args->reply, 'x', args->reply_capacity);
  args->reply_bytes = args->reply_capacity + 1000;
  return 0;
}
