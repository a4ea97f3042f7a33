#include <cubridge/detail/check.hpp>
#include <cubridge/detail/enum_names.hpp>
#include <cubridge/driver.hpp>
#include <cubridge/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <string>

namespace cubridge {
namespace {

std::string compose(const std::string& call, const std::string& code_name,
                    const std::string& description, const std::string& involved,
                    const std::source_location& where) {
  std::string text = call + " " + code_name;
  if (!description.empty()) text += " (" + description + ")";
  if (!involved.empty()) text += ": " + involved;
  text += " [" + std::string(where.file_name()) + ":" + std::to_string(where.line()) + "]";
  return text;
}

std::string_view describe(errc code) noexcept {
  switch (code) {
    case errc::no_driver:
      return "no usable CUDA driver";
    case errc::bad_image:
      return "not a valid GPU image";
    case errc::incompatible_image:
      return "image has no code for this device";
    case errc::bad_launch_arguments:
      return "launch arguments do not match the kernel";
    case errc::context_reset:
      return "context was reset or destroyed by someone else";
    case errc::precondition:
      return "precondition violated";
    case errc::io:
      return "input/output failure";
    case errc::version_rejected:
      return "module version rejected";
    case errc::bad_bundle:
      return "module bundle refused";
    case errc::guest_damage:
      return "a guest call broke the host's state";
    case errc::sandbox_failure:
      return "the sandbox worker failed";
  }
  return "unknown cubridge error";
}

}  // namespace

std::string_view to_string(errc code) noexcept {
  static constexpr std::array<detail::enum_name<errc>, 11> names{{
      {errc::no_driver, "CUBRIDGE_NO_DRIVER"},
      {errc::bad_image, "CUBRIDGE_BAD_IMAGE"},
      {errc::incompatible_image, "CUBRIDGE_INCOMPATIBLE_IMAGE"},
      {errc::bad_launch_arguments, "CUBRIDGE_BAD_LAUNCH_ARGUMENTS"},
      {errc::context_reset, "CUBRIDGE_CONTEXT_RESET"},
      {errc::precondition, "CUBRIDGE_PRECONDITION"},
      {errc::io, "CUBRIDGE_IO"},
      {errc::version_rejected, "CUBRIDGE_VERSION_REJECTED"},
      {errc::bad_bundle, "CUBRIDGE_BAD_BUNDLE"},
      {errc::guest_damage, "CUBRIDGE_GUEST_DAMAGE"},
      {errc::sandbox_failure, "CUBRIDGE_SANDBOX_FAILURE"},
  }};
  static_assert(detail::lists_values_in_order(names, 1));  // errc starts at 1
  return detail::name_of(names, code, "CUBRIDGE_UNKNOWN");
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

namespace detail {

void throw_errc(errc code, std::string call, std::string involved, std::source_location where) {
  auto name = std::string(to_string(code));
  auto text = std::string(describe(code));
  const auto source = error_source::cubridge;
  const int value = static_cast<int>(code);
  switch (code) {
    case errc::no_driver:
      throw driver_unavailable(source, value, name, text, std::move(call), std::move(involved),
                               where);
    case errc::bad_image:
    case errc::incompatible_image:
      throw image_error(source, value, name, text, std::move(call), std::move(involved), where);
    case errc::bad_launch_arguments:
      throw launch_argument_error(source, value, name, text, std::move(call), std::move(involved),
                                  where);
    case errc::version_rejected:
      throw version_rejected_error(source, value, name, text, std::move(call), std::move(involved),
                                   where);
    case errc::context_reset:
      throw context_reset_error(source, value, name, text, std::move(call), std::move(involved),
                                where);
    default:
      throw error(source, value, name, text, std::move(call), std::move(involved), where);
  }
}

std::string driver_error_name(CUresult result) {
  if (driver::available()) {
    const char* name = nullptr;
    if (driver::api().cuGetErrorName(result, &name) == CUDA_SUCCESS && name) return name;
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

void throw_driver_error(CUresult result, const char* call, std::string involved,
                        std::source_location where) {
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
  throw error(error_source::runtime, result, cudaGetErrorName(result), cudaGetErrorString(result),
              call, std::move(involved), where);
}

}  // namespace detail
}  // namespace cubridge

#include <cstdio>

namespace cubridge::detail {
void report_release_failure(CUresult result, const char* call) noexcept {
  if (result == CUDA_ERROR_DEINITIALIZED || result == CUDA_ERROR_CONTEXT_IS_DESTROYED) return;
#ifndef NDEBUG
  try {
    std::fprintf(stderr, "cubridge: %s failed in a destructor: %s\n", call,
                 driver_error_name(result).c_str());
  } catch (...) {
  }
#else
  (void)call;
#endif
}
}  // namespace cubridge::detail
