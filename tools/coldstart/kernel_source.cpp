#include "kernel_source.hpp"

#include <nvrtc.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace cubridge::tool::coldstart {
namespace {

constexpr std::string_view source = R"(
// cubridge coldstart: the smallest useful kernel; it writes only, so it reads no uninitialised
// memory.
extern "C" __global__ void coldstart_fill(float* y, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * static_cast<float>(i);
}
)";

[[noreturn]] void fail(const char* call, nvrtcResult r, const std::string& log = {}) {
  std::string message = std::string(call) + " failed: " + nvrtcGetErrorString(r);
  if (!log.empty()) message += "\n" + log;
  throw std::runtime_error(message);
}

}  // namespace

std::string_view kernel_source() noexcept {
  return source;
}

std::vector<char> compile_kernel(std::string_view architecture) {
  const std::string text(source);
  nvrtcProgram program = nullptr;
  if (const nvrtcResult r =
          nvrtcCreateProgram(&program, text.c_str(), "coldstart_kernel.cu", 0, nullptr, nullptr);
      r != NVRTC_SUCCESS)
    fail("nvrtcCreateProgram", r);
  const auto destroy = [](nvrtcProgram* p) { nvrtcDestroyProgram(p); };
  std::unique_ptr<nvrtcProgram, decltype(destroy)> guard(&program, destroy);

  const std::string arch_option = "--gpu-architecture=" + std::string(architecture);
  const char* options[] = {arch_option.c_str()};
  if (const nvrtcResult r = nvrtcCompileProgram(program, 1, options); r != NVRTC_SUCCESS) {
    std::size_t log_size = 0;
    std::string log;
    if (nvrtcGetProgramLogSize(program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    fail("nvrtcCompileProgram", r, log);
  }

  const bool want_cubin = architecture.starts_with("sm_");
  std::size_t size = 0;
  std::vector<char> out;
  if (want_cubin) {
    if (const nvrtcResult r = nvrtcGetCUBINSize(program, &size); r != NVRTC_SUCCESS)
      fail("nvrtcGetCUBINSize", r);
    out.resize(size);
    if (const nvrtcResult r = nvrtcGetCUBIN(program, out.data()); r != NVRTC_SUCCESS)
      fail("nvrtcGetCUBIN", r);
  } else {
    if (const nvrtcResult r = nvrtcGetPTXSize(program, &size); r != NVRTC_SUCCESS)
      fail("nvrtcGetPTXSize", r);
    out.resize(size);  // includes the terminating NUL
    if (const nvrtcResult r = nvrtcGetPTX(program, out.data()); r != NVRTC_SUCCESS)
      fail("nvrtcGetPTX", r);
  }
  return out;
}

std::string nvrtc_version() {
  int major = 0;
  int minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return {};
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace cubridge::tool::coldstart
