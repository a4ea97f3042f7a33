#include "cublas_library.hpp"

#include <dlfcn.h>

#include <stdexcept>
#include <type_traits>

namespace cubridge::tool::coldstart {
namespace {

cublas_library open_cublas() {
  const std::string soname = cublas_soname();
  void* handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept until exit
  if (!handle) {
    const char* why = ::dlerror();
    throw std::runtime_error("cannot load " + soname + ": " + (why ? why : "dlopen failed"));
  }
  cublas_library lib;
  auto resolve = [&](auto& slot, const char* name) {
    void* symbol = ::dlsym(handle, name);
    if (!symbol) throw std::runtime_error(soname + " has no " + name);
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
  };
  // The _v2 names are what cublas_v2.h's cublasCreate and cublasDestroy macros stand for.
  resolve(lib.create, "cublasCreate_v2");
  resolve(lib.destroy, "cublasDestroy_v2");
  resolve(lib.get_property, "cublasGetProperty");
  resolve(lib.status_name, "cublasGetStatusName");
  resolve(lib.status_string, "cublasGetStatusString");
  return lib;
}

}  // namespace

std::string cublas_soname() {
  return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
}

std::string cublas_library::status_text(cublasStatus_t s) const {
  return std::string(status_name(s)) + " (" + status_string(s) + ")";
}

int cublas_library::version() const {
  int major = 0;
  int minor = 0;
  int patch = 0;
  if (get_property(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      get_property(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      get_property(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
    return 0;
  return major * 10000 + minor * 100 + patch;
}

const cublas_library& load_cublas() {
  static const cublas_library lib = open_cublas();  // a failed load throws again next time
  return lib;
}

}  // namespace cubridge::tool::coldstart
