#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/log.hpp>
#include <cubridge/core/process_health.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <string>
#include <string_view>
#include <utility>

#ifndef CUBRIDGE_SOURCE_ROOT
#define CUBRIDGE_SOURCE_ROOT ""
#endif
#ifndef CUBRIDGE_SOURCE_FROM_BUILD
#define CUBRIDGE_SOURCE_FROM_BUILD ""
#endif

namespace cubridge {
namespace {

// A location of cubridge's own sources as the repository names it ("src/core/module.cpp"):
// GCC 12 does not remap std::source_location by -fmacro-prefix-map, so the build's two forms
// (absolute, and relative to the build tree as Ninja passes them) are cut here.
std::string_view project_relative(std::string_view file) {
  for (const std::string_view prefix : {CUBRIDGE_SOURCE_ROOT, CUBRIDGE_SOURCE_FROM_BUILD})
    if (!prefix.empty() && file.starts_with(prefix)) return file.substr(prefix.size());
  return file;
}

std::string compose(const std::string& call, const std::string& code_name,
                    const std::string& description, const std::string& involved,
                    const std::source_location& where) {
  std::string text = call + " " + code_name;
  if (!description.empty()) text += " (" + description + ")";
  if (!involved.empty()) text += ": " + involved;
  text += " [" + std::string(project_relative(where.file_name())) + ":" +
          std::to_string(where.line()) + "]";
  return text;
}

}  // namespace

std::string_view to_string(errc code) noexcept {
  return core_error_domain.name(static_cast<int>(code));
}

error::error(error_source source, int code, std::string code_name, std::string description,
             std::string call, std::string involved, std::source_location where)
    : std::runtime_error(compose(call, code_name, description, involved, where)),
      source_(source),
      code_(code),
      code_name_(std::move(code_name)),
      description_(std::move(description)),
      call_(std::move(call)),
      involved_(std::move(involved)),
      where_(where) {}

error::error(const error_domain& domain, int code, std::string description, std::string call,
             std::string involved, std::source_location where)
    : error(error_source::cubridge, code, std::string(domain.name(code)),
            description.empty() ? std::string(domain.description(code)) : std::move(description),
            std::move(call), std::move(involved), where) {
  domain_ = &domain;
}

namespace detail {

void throw_errc(errc code, std::string call, std::string involved, std::source_location where) {
  const int value = static_cast<int>(code);
  switch (code) {
    case errc::no_driver:
      throw driver_unavailable(core_error_domain, value, {}, std::move(call), std::move(involved),
                               where);
    case errc::bad_image:
    case errc::incompatible_image:
      throw image_error(core_error_domain, value, {}, std::move(call), std::move(involved), where);
    case errc::bad_launch_arguments:
      throw launch_argument_error(core_error_domain, value, {}, std::move(call),
                                  std::move(involved), where);
    case errc::context_reset:
      throw context_reset_error(core_error_domain, value, {}, std::move(call), std::move(involved),
                                where);
    default:
      throw error(core_error_domain, value, {}, std::move(call), std::move(involved), where);
  }
}

namespace {

// The names cubridge reports most, for machines without a driver (a CPU-only CI, a record
// made before the driver loaded): the sticky errors and the start-up ones.
constexpr std::array<std::pair<CUresult, std::string_view>, 14> known_driver_errors{{
    {CUDA_SUCCESS, "CUDA_SUCCESS"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"},
}};

}  // namespace

std::string driver_error_name(CUresult result) {
  if (driver::available()) {
    const char* name = nullptr;
    if (driver::api().cuGetErrorName(result, &name) == CUDA_SUCCESS && name) return name;
  }
  for (const auto& [code, name] : known_driver_errors)
    if (code == result) return std::string(name);
  return "CUresult " + std::to_string(static_cast<int>(result));
}

void throw_driver_error(CUresult result, const char* call, std::string involved,
                        std::source_location where) {
  note_cuda_result(result, call);
  std::string description;
  if (driver::available()) {
    const char* text = nullptr;
    if (driver::api().cuGetErrorString(result, &text) == CUDA_SUCCESS && text) description = text;
  }
  auto name = driver_error_name(result);
  if (result == CUDA_ERROR_CONTEXT_IS_DESTROYED)
    throw context_reset_error(error_source::driver, result, std::move(name), std::move(description),
                              call, std::move(involved), where);
  throw error(error_source::driver, result, std::move(name), std::move(description), call,
              std::move(involved), where);
}

void throw_runtime_error(cudaError_t result, const char* call, std::string involved,
                         std::source_location where) {
  // The runtime's sticky codes (cudaErrorIllegalAddress = 700, ...) are the driver's numbers.
  note_cuda_result(static_cast<CUresult>(result), call);
  throw error(error_source::runtime, result, cudaGetErrorName(result), cudaGetErrorString(result),
              call, std::move(involved), where);
}

void throw_moved_from(std::string_view type, std::string_view consequence) {
  std::string involved(type);
  involved += " was moved from or released: it holds no handle any more";
  if (!consequence.empty()) involved += " (" + std::string(consequence) + ")";
  throw_errc(errc::precondition, std::string(type), std::move(involved));
}

}  // namespace detail
}  // namespace cubridge

#include <cassert>

namespace cubridge::detail {
void report_release_failure(CUresult result, const char* call) noexcept {
  if (result == CUDA_ERROR_DEINITIALIZED || result == CUDA_ERROR_CONTEXT_IS_DESTROYED) return;
  // In a poisoned process every release fails with the sticky error: that is the process's
  // state (process_health), not a bug in the release.
  note_cuda_result(result, call);
  if (is_sticky_error(result)) return;
  try {
    log::error(std::string(call) + " failed in a destructor: " + driver_error_name(result));
  } catch (...) {
  }
  // Debug builds stop here, as RMM's RMM_ASSERT_CUDA_SUCCESS_SAFE_SHUTDOWN does: a release that
  // fails is a bug (a double free, a handle of another context) that Release only reports.
  assert(false && "a CUDA release failed in a destructor (see the line above)");
}
}  // namespace cubridge::detail
