/* A library for the sandbox's CPU tests: entry points (sandbox_entry.hpp) that behave and
 * misbehave without touching CUDA, so worker crash, abort, hang and exit detection run anywhere. */
#include <cubridge/isolation/sandbox_entry.hpp>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

/* Writes the request, as it is, to the worker's end of the host socket (descriptor 3), then
 * returns: a library speaking the protocol in the worker's name (a forged frame, then the
 * worker's own result). */
CUBRIDGE_SANDBOX_EXPORT int write_to_host(cubridge_sandbox_args* args) {
  const char* p = (const char*)args->request;
  size_t left = args->request_bytes;
  while (left > 0) {
    ssize_t n = write(3, p, left);
    if (n <= 0) return -1;
    p += n;
    left -= (size_t)n;
  }
  return 0;
}

/* Starts a process that stays in the worker's process group and sleeps; returns its pid. */
CUBRIDGE_SANDBOX_EXPORT int leave_child(cubridge_sandbox_args* args) {
  (void)args;
  pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return (int)pid;
}

/* Starts a daemon the way a library's helper often is: forked twice, in a session of its own
 * (setsid), its parent gone, so that it is nobody's child in the worker; returns its pid. */
CUBRIDGE_SANDBOX_EXPORT int leave_daemon(cubridge_sandbox_args* args) {
  int fds[2];
  (void)args;
  if (pipe(fds) != 0) return -1;
  pid_t middle = fork();
  if (middle == 0) {
    setsid();
    pid_t daemon = fork();
    if (daemon == 0) {
      pid_t self = getpid();
      (void)!write(fds[1], &self, sizeof self);
      for (;;) pause();
    }
    _exit(0);
  }
  pid_t daemon = -1;
  (void)!read(fds[0], &daemon, sizeof daemon);
  close(fds[0]);
  close(fds[1]);
  waitpid(middle, NULL, 0);
  return (int)daemon;
}
