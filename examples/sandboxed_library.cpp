// An out-of-process sandbox: a vendor library runs in a worker process on the host's buffer in
// place (VMM memory exported as a file descriptor). When its buggy function faults, only the
// worker dies: the host gets a sandbox_error, a fresh worker, and keeps its own GPU state.
//   sandboxed_library VENDOR_LIBRARY.so [WORKER]
#include <cubridge/core/driver.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s VENDOR_LIBRARY.so [cubridge-sandbox-worker]\n", argv[0]);
    return 64;
  }
  if (!cubridge::driver::available()) {
    std::printf("sandboxed_library: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;  // skipped
  }
  const auto dev = cubridge::device::get(0);
  auto primary = cubridge::primary_context::retain(dev);
  cubridge::scoped_current current(primary);
  auto data =
      cubridge::shared_device_memory::allocate(dev, 1 << 22, cubridge::memory_export::posix_fd);
  const std::size_t n = data.size_bytes() / sizeof(float);
  std::vector<float> values(n, 1.0f);
  cudaMemcpy(data.span<float>().data(), values.data(), data.size_bytes(), cudaMemcpyHostToDevice);

  auto box = cubridge::sandbox::start({.library = argv[1], .worker = argc > 2 ? argv[2] : ""});
  auto shared = box.share(data);
  std::printf("sandboxed_library: worker %d up in %.1f ms\n", int(box.worker_pid()),
              std::chrono::duration<double, std::milli>(box.last_start_duration()).count());
  box.call("vendor_add_one", {.buffers = {shared}});  // 1 -> 2, in the host's memory
  try {
    box.call("vendor_buggy", {.buffers = {shared}});
  } catch (const cubridge::sandbox_error& e) {
    std::printf("sandboxed_library: %s\n", e.what());
  }
  box.call("vendor_add_one", {.buffers = {shared}});  // the fresh worker: 2 -> 3
  cudaMemcpy(values.data(), data.span<float>().data(), data.size_bytes(), cudaMemcpyDeviceToHost);
  std::size_t wrong = 0;
  for (float v : values) wrong += v != 3.0f;
  std::printf(
      "sandboxed_library: %zu of %zu elements wrong after two sandboxed calls and a fault; "
      "host context %s\n",
      wrong, n, primary.was_reset() ? "RESET" : "intact");
  return wrong == 0 ? 0 : 1;
}
