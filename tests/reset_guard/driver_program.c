// Loads the third-party library (argv[1]) and calls one of its reset functions (argv[2]); prints
// what that function returned and how many resets/synchronizations the (fake) driver saw.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s THIRD_PARTY_LIBRARY FUNCTION\n", argv[0]);
    return 64;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  int (*function)(void) = (int (*)(void))dlsym(library, argv[2]);
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  int (*reset_count)(void) = driver ? (int (*)(void))dlsym(driver, "fake_reset_count") : NULL;
  int (*sync_count)(void) = driver ? (int (*)(void))dlsym(driver, "fake_sync_count") : NULL;
  if (function == NULL || reset_count == NULL || sync_count == NULL) {
    fprintf(stderr, "missing symbol (%s, fake_reset_count or fake_sync_count)\n", argv[2]);
    return 1;
  }
  int result = function();
  printf("result=%d resets=%d syncs=%d\n", result, reset_count(), sync_count());
  return result == 0 ? 0 : 1;
}
