// `cubridge coldstart-probe`: one start of a CUDA program, timed phase by phase (see probe.hpp).
//
// What each phase times (std::chrono::steady_clock around the raw calls, nothing else inside):
//   process_start  from the parent's clock reading just before posix_spawn to this file's static
//                  initialisation: exec, ld.so mapping the tool and its libraries (NVRTC,
//                  nvJitLink), their constructors (CLOCK_MONOTONIC is one clock for all processes)
//   driver_load    dlopen("libcuda.so.1") + dlsym(cuGetProcAddress_v2) + cuGetProcAddress for
//                  every entry point cubridge uses, as cubridge::driver does
//   cu_init        cuInit(0), through the pointer just resolved
//   context        cuDevicePrimaryCtxRetain + cuCtxSetCurrent, or cuCtxCreate (ctx-create)
//   first_alloc    cuMemAlloc of 1 MiB
//   nvrtc_compile  (nvrtc only) nvrtcCreateProgram + nvrtcCompileProgram for sm_XY + nvrtcGetCUBIN
//   module_load    cuModuleLoadDataEx of the cubin or PTX (only an error-log buffer as option)
//   get_function   cuModuleGetFunction
//   first_launch   cuLaunchKernel + cuCtxSynchronize
//   second_launch  the same again
//   cublas_load    dlopen of the toolkit's libcublas.so.<major> (the tool does not link it)
//   cublas_create  cublasCreate in the current context
// Between phases, untimed: cubridge::driver::api() (its own dlopen and cuInit are then no-ops
// but for the cached lookups), cuDeviceGet, the device's attributes, cuModuleGetLoadingMode.
#include "probe.hpp"

#include "cublas_library.hpp"
#include "kernel_source.hpp"
#include "phase_timings.hpp"

#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>

#include <cuda.h>
#include <dlfcn.h>
#include <library_types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::tool::coldstart {
namespace {

using clock = std::chrono::steady_clock;

// Taken during static initialisation, i.e. once the process and its libraries are loaded and
// before main: the end of the process_start phase.
const clock::time_point process_entered = clock::now();

constexpr int exit_ok = 0;
constexpr int exit_failed = 1;
constexpr int exit_no_driver = 69;

/// A failure that ends the probe: its message, and whether it means "no driver / no device".
struct probe_failure : std::runtime_error {
  probe_failure(const std::string& what, bool no_driver_)
      : std::runtime_error(what), no_driver(no_driver_) {}
  bool no_driver;
};

/// Writes one line to stdout with write(2): unbuffered, so a line written before a crash arrives.
void emit(std::string line) {
  line += '\n';
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(1, line.data() + done, line.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

std::string cu_error_text(const driver::entry_points* api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api && api->cuGetErrorName) api->cuGetErrorName(r, &name);
  if (api && api->cuGetErrorString) api->cuGetErrorString(r, &text);
  std::string out = name ? name : "CUresult " + std::to_string(static_cast<int>(r));
  if (text) out += std::string(" (") + text + ")";
  return out;
}

/// The ABI version cubridge::driver asks for (see abi_version in src/core/driver.cpp): these three
/// have a newer signature under the old name at CUDA 13.
int abi_version(std::string_view name) {
  if (name == "cuCtxGetDevice" || name == "cuCtxSynchronize" || name == "cuStreamGetCtx")
    return 12000;
  return CUDA_VERSION;
}

/// The cubin or PTX the parent wrote, through detail::read_regular_file: a FIFO or a device at
/// the path is refused ("'<path>' is a FIFO, not a regular file") instead of hanging the probe
/// until its deadline.
std::vector<char> read_file(const std::string& path, bool nul_terminate) {
  std::vector<std::byte> raw;
  try {
    raw = cubridge::detail::read_regular_file(path, std::uint64_t{2} << 30, "image");
  } catch (const cubridge::error& e) {
    throw probe_failure(e.involved(), false);
  }
  const auto* first = reinterpret_cast<const char*>(raw.data());
  std::vector<char> bytes(first, first + raw.size());
  if (nul_terminate && (bytes.empty() || bytes.back() != '\0')) bytes.push_back('\0');
  return bytes;
}

std::string driver_release() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return {};
  return parse_driver_release(line);
}

/// Runs phases, records their times into a run_result, names the phase that failed.
class recorder {
 public:
  explicit recorder(run_result& result) : result_(result) {}

  template <class F>
  void phase(std::string_view key, F&& body) {
    emit("phase " + std::string(key));
    current_ = key;
    const auto start = clock::now();
    body();
    const auto end = clock::now();
    result_.phases.push_back(
        {std::string(key), std::chrono::duration<double, std::milli>(end - start).count()});
    current_ = "after " + std::string(key);  // a failure between phases names the one before
  }
  [[nodiscard]] const std::string& current() const noexcept { return current_; }

 private:
  run_result& result_;
  std::string current_ = "start";
};

/// Loads the driver the way cubridge::driver does: dlopen, then cuGetProcAddress for every entry
/// point into `ep`.
void load_driver(driver::entry_points& ep) {
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // kept until exit
  if (!library) throw probe_failure("no CUDA driver: libcuda.so.1 not found", true);
  using get_proc_fn =
      CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<get_proc_fn>(::dlsym(library, "cuGetProcAddress_v2"));
  if (!get_proc)
    throw probe_failure("CUDA driver too old: libcuda.so.1 has no cuGetProcAddress_v2", true);
  auto resolve = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult status{};
    const CUresult r =
        get_proc(name, slot, abi_version(name), CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || !*slot)
      throw probe_failure(std::string("CUDA driver too old: no ") + name, true);
  };
#define CUBRIDGE_COLDSTART_RESOLVE(name) resolve(#name, reinterpret_cast<void**>(&ep.name));
  CUBRIDGE_DRIVER_ENTRY_POINTS(CUBRIDGE_COLDSTART_RESOLVE)
#undef CUBRIDGE_COLDSTART_RESOLVE
}

class probe {
 public:
  probe(const probe_options& o, run_result& r) : options_(o), result_(r), rec_(r) {}

  void run() {
    const auto scen = result_.scen;
    std::vector<char> image = read_inputs(scen);  // before any timing
    record_process_start();
    const opened_device device = open_device();
    rec_.phase("context", [&] { make_context_current(scen, device.device); });
    rec_.phase("first_alloc", [&] { check(api_->cuMemAlloc(&buffer_, bytes), "cuMemAlloc"); });
    if (scen == scenario::nvrtc) {
      const std::string arch = "sm_" + std::to_string(device.capability);
      rec_.phase("nvrtc_compile", [&] {
        try {
          image = compile_kernel(arch);
        } catch (const std::exception& e) {
          throw probe_failure(e.what(), false);
        }
      });
    }
    rec_.phase("module_load", [&] { load_module(image); });
    launch_twice();
    rec_.phase("cublas_load", [&] {
      try {
        blas_library_ = &load_cublas();
      } catch (const std::runtime_error& e) {
        throw probe_failure(e.what(), false);
      }
    });
    rec_.phase("cublas_create", [&] {
      if (const cublasStatus_t s = blas_library_->create(&blas_); s != CUBLAS_STATUS_SUCCESS)
        throw probe_failure("cublasCreate: " + blas_library_->status_text(s), false);
    });
    verify_output();
    result_.ok = true;
  }

  /// Releases what run() created, untimed (the context itself goes with the process).
  void clean_up() noexcept {
    if (blas_) blas_library_->destroy(blas_);
    if (api_ && module_) api_->cuModuleUnload(module_);
    if (api_ && buffer_) api_->cuMemFree(buffer_);
  }

  [[nodiscard]] const std::string& current_phase() const noexcept { return rec_.current(); }

 private:
  void check(CUresult r, const char* call) const {
    if (r != CUDA_SUCCESS)
      throw probe_failure(std::string(call) + " " + cu_error_text(api_, r), false);
  }

  static constexpr std::size_t bytes = 1 << 20;  ///< the kernel's buffer
  static constexpr int elements = static_cast<int>(bytes / sizeof(float));
  static constexpr float scale = 2.0f;  ///< the kernel's `a`: y[i] = a * i

  struct opened_device {
    CUdevice device = 0;
    int capability = 0;  ///< major * 10 + minor
  };

  [[nodiscard]] std::vector<char> read_inputs(scenario scen) const {
    if (scen == scenario::cubin || scen == scenario::ctx_create)
      return read_file(options_.cubin_path, false);
    if (scen == scenario::ptx_cold || scen == scenario::ptx_warm)
      return read_file(options_.ptx_path, true);
    return {};
  }

  /// The time from the parent's spawn call to this process's first static initialiser.
  void record_process_start() {
    if (options_.spawned_at_ns <= 0) return;
    const long long entered_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(process_entered.time_since_epoch())
            .count();
    result_.phases.push_back(
        {"process_start", static_cast<double>(entered_ns - options_.spawned_at_ns) / 1e6});
  }

  /// The driver_load and cu_init phases, then the device and the loading mode, untimed.
  opened_device open_device() {
    rec_.phase("driver_load", [&] { load_driver(own_); });
    rec_.phase("cu_init", [&] {
      if (const CUresult r = own_.cuInit(0); r != CUDA_SUCCESS)
        throw probe_failure("no usable CUDA device: cuInit failed with " + cu_error_text(&own_, r),
                            true);
    });
    api_ = &driver::api();
    opened_device d;
    check(api_->cuDeviceGet(&d.device, options_.device), "cuDeviceGet");
    int major = 0;
    int minor = 0;
    check(
        api_->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d.device),
        "cuDeviceGetAttribute");
    check(
        api_->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d.device),
        "cuDeviceGetAttribute");
    d.capability = major * 10 + minor;
    CUmoduleLoadingMode mode{};
    if (api_->cuModuleGetLoadingMode(&mode) == CUDA_SUCCESS)
      result_.loading_reported = mode == CU_MODULE_LAZY_LOADING ? "LAZY" : "EAGER";
    return d;
  }

  /// A context of its own for ctx_create, the primary context for every other scenario.
  void make_context_current(scenario scen, CUdevice dev) const {
    CUcontext ctx = nullptr;
    if (scen == scenario::ctx_create) {
      check(api_->cuCtxCreate(&ctx, nullptr, 0, dev), "cuCtxCreate");
    } else {
      check(api_->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      check(api_->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    }
  }

  void load_module(const std::vector<char>& image) {
    std::string log(8192, '\0');
    CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* values[] = {log.data(), reinterpret_cast<void*>(log.size())};
    const CUresult r = api_->cuModuleLoadDataEx(&module_, image.data(), 2, keys, values);
    if (r != CUDA_SUCCESS) {
      if (const auto end = log.find('\0'); end != std::string::npos) log.resize(end);
      throw probe_failure(
          "cuModuleLoadDataEx " + cu_error_text(api_, r) + (log.empty() ? "" : "\n" + log), false);
    }
  }

  /// The get_function, first_launch and second_launch phases.
  void launch_twice() {
    CUfunction function = nullptr;
    rec_.phase("get_function", [&] {
      check(api_->cuModuleGetFunction(&function, module_, std::string(kernel_name).c_str()),
            "cuModuleGetFunction");
    });
    int n = elements;
    float a = scale;
    void* params[] = {&buffer_, &a, &n};
    const auto launch = [&] {
      check(api_->cuLaunchKernel(function, static_cast<unsigned>(n / 256), 1, 1, 256, 1, 1, 0,
                                 nullptr, params, nullptr),
            "cuLaunchKernel");
      check(api_->cuCtxSynchronize(), "cuCtxSynchronize");
    };
    rec_.phase("first_launch", launch);
    rec_.phase("second_launch", launch);
  }

  /// The kernel really ran: y[n - 1] == a * (n - 1).
  void verify_output() const {
    float last = 0;
    check(api_->cuMemcpy(reinterpret_cast<CUdeviceptr>(&last), buffer_ + (bytes - sizeof(float)),
                         sizeof(float)),
          "cuMemcpy");
    const float expected = scale * static_cast<float>(elements - 1);
    if (last != expected)
      throw probe_failure("the kernel wrote " + std::to_string(last) + " where " +
                              std::to_string(expected) + " was expected",
                          false);
  }

  const probe_options& options_;
  run_result& result_;
  recorder rec_;
  driver::entry_points own_;                   ///< resolved by the driver_load phase itself
  const driver::entry_points* api_ = nullptr;  ///< cubridge::driver::api(), after cu_init
  CUdeviceptr buffer_ = 0;
  CUmodule module_ = nullptr;
  const cublas_library* blas_library_ = nullptr;  ///< by the cublas_load phase
  cublasHandle_t blas_ = nullptr;
};

int run_info(const probe_options& o) {
  nlohmann::json out;
  try {
    const auto& api = driver::api();
    machine_info m;
    CUdevice dev = 0;
    int count = 0;
    if (api.cuDeviceGetCount(&count) != CUDA_SUCCESS || o.device < 0 || o.device >= count)
      throw probe_failure(
          "no CUDA device " + std::to_string(o.device) + " (" + std::to_string(count) + " present)",
          true);
    if (const CUresult r = api.cuDeviceGet(&dev, o.device); r != CUDA_SUCCESS)
      throw probe_failure("cuDeviceGet " + cu_error_text(&api, r), false);
    char name[256] = {};
    api.cuDeviceGetName(name, sizeof name - 1, dev);
    m.gpu = name;
    int major = 0;
    int minor = 0;
    api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    m.compute_capability = major * 10 + minor;
    m.driver_version = driver::version();
    m.driver_release = driver_release();
    m.nvrtc_version = nvrtc_version();
    try {
      m.cublas_version = load_cublas().version();
    } catch (const std::runtime_error&) {
      m.cublas_version = 0;  // no cuBLAS: the machine's table says 0, as for an old one
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) m.host = host;
    out = {{"ok", true}, {"machine", m}};
    emit(out.dump());
    return exit_ok;
  } catch (const driver_unavailable&) {
    out = {{"ok", false}, {"no_driver", true}, {"error", driver::unavailable_reason()}};
  } catch (const probe_failure& e) {
    out = {{"ok", false}, {"no_driver", e.no_driver}, {"error", e.what()}};
  } catch (const std::exception& e) {
    out = {{"ok", false}, {"no_driver", false}, {"error", e.what()}};
  }
  emit(out.dump());
  return out["no_driver"].get<bool>() ? exit_no_driver : exit_failed;
}

}  // namespace

int run_probe(const probe_options& o) noexcept {
  try {
    if (o.info) return run_info(o);
    run_result result;
    const auto loading = parse_loading(o.loading);
    const auto scen = parse_scenario(o.scenario);
    if (!loading || !scen) {
      emit(nlohmann::json{{"ok", false}, {"error", "coldstart-probe: bad --loading or --scenario"}}
               .dump());
      return exit_failed;
    }
    result.loading = *loading;
    result.scen = *scen;
    probe p(o, result);
    int status = exit_ok;
    try {
      p.run();
    } catch (const probe_failure& e) {
      result.failed_phase = p.current_phase();
      result.error = e.what();
      status = e.no_driver ? exit_no_driver : exit_failed;
    } catch (const std::exception& e) {
      result.failed_phase = p.current_phase();
      result.error = e.what();
      status = exit_failed;
    }
    emit(nlohmann::json(result).dump());
    emit("phase exit");
    p.clean_up();
    return status;
  } catch (...) {
    return exit_failed;  // out of memory while reporting: the parent sees no JSON line
  }
}

std::string parse_driver_release(std::string_view version_line) {
  std::size_t at = 0;
  while (at < version_line.size()) {
    const auto start = version_line.find_first_not_of(' ', at);
    if (start == std::string_view::npos) break;
    const auto end = std::min(version_line.find(' ', start), version_line.size());
    const auto word = version_line.substr(start, end - start);
    const bool version_like = word.find('.') != std::string_view::npos &&
                              std::isdigit(static_cast<unsigned char>(word.front())) &&
                              word.find_first_not_of("0123456789.") == std::string_view::npos;
    if (version_like) return std::string(word);
    at = end;
  }
  return {};
}

}  // namespace cubridge::tool::coldstart
