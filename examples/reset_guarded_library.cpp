// The reset guard: a vendor library (static cudart) that calls cudaDeviceReset() when it is done
// runs in the host's own primary context, with no guest context around it. Run it under
//   CUBRIDGE_RESET_POLICY=deny LD_PRELOAD=libcubridge_reset_guard.so reset_guarded_library
// and the guard turns the reset into a synchronize: the host's buffer survives. Without the guard
// the same run shows the damage (the primary context and the buffer are gone).
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" int vendor_finish(cubridge_sandbox_args* args);  // the vendor library, linked

int main() {
  if (!cubridge::driver::available()) {
    std::printf("reset_guarded_library: no GPU: %s\n",
                cubridge::driver::unavailable_reason().c_str());
    return 77;  // skipped
  }
  const char* policy = std::getenv("CUBRIDGE_RESET_POLICY");
  std::printf("reset_guarded_library: reset policy %s\n",
              policy ? policy : "(no guard configured)");
  auto primary = cubridge::primary_context::retain(cubridge::device::get(0));
  cubridge::scoped_current current(primary);
  auto data = cubridge::driver_buffer<unsigned>::allocate(primary, 1 << 20);
  const auto& api = cubridge::driver::api();
  if (api.cuMemsetD32(data.address(), 0xC0FFEE, data.size()) != CUDA_SUCCESS) return 1;

  cubridge_sandbox_args args{.struct_size = sizeof(cubridge_sandbox_args),
                             .abi_version = CUBRIDGE_SANDBOX_ABI_VERSION};
  std::printf("reset_guarded_library: vendor_finish returned %d\n", vendor_finish(&args));

  std::vector<unsigned> back(data.size());
  const CUresult copy =
      api.cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), data.address(), data.size_bytes());
  std::size_t wrong = 0;
  for (unsigned v : back) wrong += v != 0xC0FFEE;
  const bool intact = copy == CUDA_SUCCESS && wrong == 0 && !primary.was_reset();
  std::printf("reset_guarded_library: host buffer %s\n", intact ? "intact" : "DESTROYED");
  if (!intact) (void)data.release();  // its memory went with the primary context
  return intact ? 0 : 1;
}
