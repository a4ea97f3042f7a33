/* A library for the sandbox's pool, standby and environment tests (CPU, no CUDA): entries that
 * say which worker serves them and what it sees, entries that meet each other across workers
 * (they deadlock if the calls are serialized; each gives up after 60 s and returns -1), and a
 * load gate that lets the first worker load it and holds every later one in dlopen. */
#define _GNU_SOURCE
#include <cubridge/isolation/sandbox_entry.hpp>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { patience_ms = 60 * 1000 };

/* The request as a NUL-terminated string (truncated to fit). */
static void request_text(const cubridge_sandbox_args* args, char* out, size_t room) {
  size_t n = args->request_bytes < room - 1 ? args->request_bytes : room - 1;
  memcpy(out, args->request, n);
  out[n] = '\0';
}

static void reply_text(cubridge_sandbox_args* args, const char* text) {
  size_t n = strlen(text);
  if (n > args->reply_capacity) n = args->reply_capacity;
  memcpy(args->reply, text, n);
  args->reply_bytes = n;
}

static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static void touch(const char* path) {
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
}

/* Files in `dir` whose name starts with `prefix`. */
static int count_files(const char* dir, const char* prefix) {
  DIR* d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

/* Returns the worker's pid. */
CUBRIDGE_SANDBOX_EXPORT int pid(cubridge_sandbox_args* args) {
  (void)args;
  return (int)getpid();
}

CUBRIDGE_SANDBOX_EXPORT int crash(cubridge_sandbox_args* args) {
  volatile int* volatile nowhere = NULL;
  (void)args;
  *nowhere = 42;
  return 0;
}

/* Request: a variable's name. Reply: its value; returns 1 if it is set, 0 if not. */
CUBRIDGE_SANDBOX_EXPORT int get_env(cubridge_sandbox_args* args) {
  char name[256];
  request_text(args, name, sizeof name);
  const char* value = getenv(name);
  reply_text(args, value ? value : "");
  return value != NULL;
}

/* Request: a library's path. Returns 1 if it is loaded in the worker, 0 if not. */
CUBRIDGE_SANDBOX_EXPORT int is_loaded(cubridge_sandbox_args* args) {
  char path[4096];
  request_text(args, path, sizeof path);
  void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != NULL;
}

/* Request: "DIR N". Arrives (DIR/arrived.PID), then waits until N workers have arrived.
 * Returns the worker's pid, or -1 if they did not all come within the patience. */
CUBRIDGE_SANDBOX_EXPORT int rendezvous(cubridge_sandbox_args* args) {
  char text[4096], path[4200];
  request_text(args, text, sizeof text);
  char* space = strrchr(text, ' ');
  if (!space) return -2;
  *space = '\0';
  const int expected = atoi(space + 1);
  snprintf(path, sizeof path, "%s/arrived.%d", text, (int)getpid());
  touch(path);
  for (int waited = 0; count_files(text, "arrived.") < expected; ++waited) {
    if (waited >= patience_ms) return -1;
    pause_ms(1);
  }
  return (int)getpid();
}

/* Request: "DIR". Says it entered (DIR/entered.PID), then waits until DIR/go exists.
 * Returns the worker's pid, or -1 after the patience. */
CUBRIDGE_SANDBOX_EXPORT int wait_for_go(cubridge_sandbox_args* args) {
  char dir[4096], path[4200];
  request_text(args, dir, sizeof dir);
  snprintf(path, sizeof path, "%s/entered.%d", dir, (int)getpid());
  touch(path);
  snprintf(path, sizeof path, "%s/go", dir);
  for (int waited = 0; access(path, F_OK) != 0; ++waited) {
    if (waited >= patience_ms) return -1;
    pause_ms(1);
  }
  return (int)getpid();
}

/* With CUBRIDGE_TEST_LOAD_GATE=DIR: the first process to load the library creates DIR/first and
 * goes on; every later one says so (DIR/held.PID) and never finishes loading. With
 * CUBRIDGE_TEST_DIE_ON_LOAD=exit or crash, the load ends the worker (_exit(7), SIGSEGV). */
__attribute__((constructor)) static void load_gate(void) {
  const char* die = getenv("CUBRIDGE_TEST_DIE_ON_LOAD");
  if (die && strcmp(die, "exit") == 0) _exit(7);
  if (die && strcmp(die, "crash") == 0) *(volatile int* volatile)NULL = 1;
  const char* dir = getenv("CUBRIDGE_TEST_LOAD_GATE");
  if (!dir) return;
  char path[4200];
  snprintf(path, sizeof path, "%s/first", dir);
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return;
  }
  snprintf(path, sizeof path, "%s/held.%d", dir, (int)getpid());
  touch(path);
  for (;;) pause();
}
