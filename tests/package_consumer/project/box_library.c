/* A library for the relocated sandbox (sandbox.cpp): one entry point, no CUDA. */
#include <cubridge/isolation/sandbox_entry.hpp>

CUBRIDGE_SANDBOX_EXPORT int answer(cubridge_sandbox_args* args) {
  (void)args;
  return 42;
}
