// A guest context: a vendor library that calls cudaDeviceReset() runs in a context of its own,
// works on the host's buffer in place (VMM memory, shared by every context of the device), and
// the host's primary context and its buffers survive. cubridge checks the host after the call.
#include <cubridge/core/driver.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/guest_context.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

extern "C" int vendor_add_one(cubridge_sandbox_args* args);  // the vendor library, linked
extern "C" int vendor_finish(cubridge_sandbox_args* args);

int main() {
  if (!cubridge::driver::available()) {
    std::printf("guest_context_library: no GPU: %s\n",
                cubridge::driver::unavailable_reason().c_str());
    return 77;  // skipped
  }
  const auto dev = cubridge::device::get(0);
  // The host runs on the primary context and keeps data there.
  auto primary = cubridge::primary_context::retain(dev);
  cubridge::scoped_current current(primary);
  float* host_data = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&host_data), 1 << 20);

  // The buffer the vendor works on: VMM memory, usable from both contexts, no copies.
  auto shared = cubridge::shared_device_memory::allocate(dev, 1 << 22);
  const std::size_t n = shared.size_bytes() / sizeof(float);
  std::vector<float> values(n, 41.0f);
  cudaMemcpy(shared.span<float>().data(), values.data(), shared.size_bytes(),
             cudaMemcpyHostToDevice);

  auto guest = cubridge::guest_context::create(dev, {.name = "vendor"});  // watches the primary
  guest.watch("host data", reinterpret_cast<CUdeviceptr>(host_data), 1 << 20);
  try {
    cubridge_sandbox_buffer buffer{shared.span<float>().data(), shared.size_bytes()};
    cubridge_sandbox_args args{.struct_size = sizeof(cubridge_sandbox_args),
                               .abi_version = CUBRIDGE_SANDBOX_ABI_VERSION,
                               .buffers = &buffer,
                               .buffer_count = 1};
    const int status = guest.call([&] { return vendor_add_one(&args) + vendor_finish(&args); });
    std::printf(
        "guest_context_library: vendor returned %d and reset the device, in its own context\n",
        status);
  } catch (const cubridge::guest_error& e) {
    std::printf("guest_context_library: the vendor broke the host: %s\n", e.what());
    return 1;
  }
  cudaMemcpy(values.data(), shared.span<float>().data(), shared.size_bytes(),
             cudaMemcpyDeviceToHost);
  std::size_t wrong = 0;
  for (float v : values) wrong += v != 42.0f;
  const bool host_alive = cudaMemset(host_data, 0, 1 << 20) == cudaSuccess && !primary.was_reset();
  std::printf("guest_context_library: %zu of %zu elements wrong; host's primary context %s\n",
              wrong, n, host_alive ? "intact" : "DESTROYED");
  cudaFree(host_data);
  return wrong == 0 && host_alive ? 0 : 1;
}
