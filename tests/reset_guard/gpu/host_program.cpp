// The host of the real-driver reset-guard test: keeps a buffer in the device's primary context,
// lets a third-party library (static cudart) call cudaDeviceReset, then checks what survived.
//   reset_guard_host LIBRARY.so own-call|own-thread
// Exit 0: the host's buffer and primary context survived; 1: they were destroyed; 2: the test
// could not run its steps; 77: no GPU.
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  if (!cubridge::driver::available()) {
    std::printf("no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  auto primary = cubridge::primary_context::retain(cubridge::device::get(0));
  cubridge::scoped_current current(primary);
  constexpr std::size_t n = 1 << 16;
  std::vector<unsigned> pattern(n);
  for (std::size_t i = 0; i < n; ++i) pattern[i] = static_cast<unsigned>(i * 2654435761u);
  auto buffer = cubridge::driver_buffer<unsigned>::allocate(primary, n);
  const auto& cu = cubridge::driver::api();
  if (cu.cuMemcpy(buffer.address(), reinterpret_cast<CUdeviceptr>(pattern.data()), n * 4) !=
      CUDA_SUCCESS)
    return 2;

  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    std::printf("cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  using entry = int (*)();
  auto init = reinterpret_cast<entry>(dlsym(library, "third_party_init"));
  auto reset = reinterpret_cast<entry>(dlsym(library, std::strcmp(argv[2], "own-thread") == 0
                                                          ? "third_party_reset_from_own_thread"
                                                          : "third_party_reset"));
  if (!init || !reset || init() != 0) return 2;
  std::printf("library reset returned %d\n", reset());

  std::vector<unsigned> back(n);
  const CUresult copy =
      cu.cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), buffer.address(), n * 4);
  const bool reset_seen = primary.was_reset();
  const bool intact = copy == CUDA_SUCCESS && back == pattern && !reset_seen;
  std::printf("host buffer %s (copy %s), primary context %s\n", intact ? "intact" : "DESTROYED",
              cubridge::detail::driver_error_name(copy).c_str(),
              reset_seen ? "RESET" : "unchanged");
  if (!intact) (void)buffer.release();  // its memory went with the context
  return intact ? 0 : 1;
}
