#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/log.hpp>
#include <cubridge/core/reset_guard_status.hpp>

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <string_view>

namespace cubridge::driver {
namespace {

struct loaded_driver {
  entry_points api;
  void* library = nullptr;
  std::string failure;  // empty when loaded
};

using get_proc_address_fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                         CUdriverProcAddressQueryResult*);

/// The CUDA version whose ABI of `name` matches its declaration in cuda.h. cuda.h renames
/// functions whose signature changed (cuCtxCreate -> cuCtxCreate_v4), and for those asking for
/// CUDA_VERSION gives the declared signature. A few functions gained a newer ABI that cuda.h
/// declares under a new name instead (cuCtxSynchronize_v2 takes a context, cuStreamGetCtx_v2 a
/// green context): for them CUDA_VERSION would hand out the new signature under the old name,
/// so they are asked for at 12.0, the version of their plain declaration.
int abi_version(std::string_view name) {
  static constexpr std::string_view plain_abi_12[] = {"cuCtxGetDevice", "cuCtxSynchronize",
                                                      "cuStreamGetCtx"};
  for (auto n : plain_abi_12)
    if (n == name) return 12000;
  return CUDA_VERSION;
}

loaded_driver load() {
  loaded_driver d;
  // Leaked on purpose: entry points must stay valid until the very end of the process.
  d.library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!d.library) {
    d.failure = "no CUDA driver: libcuda.so.1 not found";
    return d;
  }
  auto get_proc = reinterpret_cast<get_proc_address_fn>(dlsym(d.library, "cuGetProcAddress_v2"));
  if (!get_proc) {
    d.failure = "CUDA driver too old: libcuda.so.1 has no cuGetProcAddress_v2 (needs CUDA 12+)";
    return d;
  }
  auto resolve = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult status{};
    const CUresult r =
        get_proc(name, slot, abi_version(name), CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || !*slot) {
      if (d.failure.empty())
        d.failure = "CUDA driver too old: libcuda.so.1 has no " + std::string(name) + " for CUDA " +
                    std::to_string(CUDA_VERSION / 1000) + "." +
                    std::to_string(CUDA_VERSION % 1000 / 10) + " (cuGetProcAddress status " +
                    std::to_string(static_cast<int>(status)) + ")";
    }
  };
#define CUBRIDGE_RESOLVE_ENTRY_POINT(name) resolve(#name, reinterpret_cast<void**>(&d.api.name));
  CUBRIDGE_DRIVER_ENTRY_POINTS(CUBRIDGE_RESOLVE_ENTRY_POINT)
#undef CUBRIDGE_RESOLVE_ENTRY_POINT
  if (!d.failure.empty()) return d;
  if (const CUresult r = d.api.cuInit(0); r != CUDA_SUCCESS) {
    const char* name = "?";
    d.api.cuGetErrorName(r, &name);
    d.failure = std::string("no usable CUDA device: cuInit failed with ") + name;
  }
  return d;
}

const loaded_driver& instance() {
  static const loaded_driver d = [] {
    warn_if_reset_guard_missing();  // the one place every program using cubridge passes
    loaded_driver loaded = load();
    if (loaded.failure.empty()) {
      int version = 0;
      loaded.api.cuDriverGetVersion(&version);
      log::debug("CUDA driver loaded: libcuda.so.1, CUDA " + std::to_string(version / 1000) + "." +
                 std::to_string(version % 1000 / 10));
    } else {
      log::debug("CUDA driver not loaded: " + loaded.failure);
    }
    return loaded;
  }();
  return d;
}

}  // namespace

const entry_points& api() {
  const auto& d = instance();
  if (!d.failure.empty()) [[unlikely]]
    detail::throw_errc(errc::no_driver, "cubridge::driver::api", d.failure);
  return d.api;
}

bool available() noexcept {
  return instance().failure.empty();
}

std::string unavailable_reason() noexcept {
  return instance().failure;
}

std::string library_path() {
  const auto& d = api();
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(d.cuInit), &info) && info.dli_fname) return info.dli_fname;
  return "libcuda.so.1";
}

int version() {
  int v = 0;
  if (const CUresult r = api().cuDriverGetVersion(&v); r != CUDA_SUCCESS)
    detail::throw_errc(errc::no_driver, "cuDriverGetVersion", "returned " + std::to_string(int(r)));
  return v;
}

}  // namespace cubridge::driver
