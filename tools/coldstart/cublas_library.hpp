// cuBLAS for the coldstart probe, loaded with dlopen when a probe first needs it: linked, it is
// mapped and relocated by every start of the tool (`cubridge --help` held 270 MB resident for it).
#pragma once

#include <cublas_v2.h>
#include <library_types.h>

#include <string>

namespace cubridge::tool::coldstart {

/// The five cuBLAS entry points the probe calls, resolved from the toolkit's libcublas.so.<major>.
/// The library stays loaded until the process exits (cuBLAS is not made to be unloaded).
struct cublas_library {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*get_property)(libraryPropertyType, int*) = nullptr;
  const char* (*status_name)(cublasStatus_t) = nullptr;
  const char* (*status_string)(cublasStatus_t) = nullptr;

  /// "CUBLAS_STATUS_NOT_INITIALIZED (the library was not initialized)".
  [[nodiscard]] std::string status_text(cublasStatus_t s) const;
  /// MAJOR * 10000 + MINOR * 100 + PATCH, as cublasGetVersion counts; 0 where it cannot say.
  [[nodiscard]] int version() const;
};

/// The soname the build's toolkit names, e.g. "libcublas.so.13".
[[nodiscard]] std::string cublas_soname();

/// Loads cuBLAS once (later calls return the same table). Throws std::runtime_error naming the
/// library and dlerror()'s reason, or the entry point it lacks.
[[nodiscard]] const cublas_library& load_cublas();

}  // namespace cubridge::tool::coldstart
