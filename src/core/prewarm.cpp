#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/prewarm.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <cuda_runtime_api.h>

#include <chrono>

namespace cubridge {

double prewarm_report::total_milliseconds() const noexcept {
  double total = 0;
  for (const auto& s : steps) total += s.milliseconds;
  return total;
}

prewarm_plan& prewarm_plan::runtime() {
  entries_.push_back({entry::kind::runtime, "CUDA runtime initialised", {}, {}});
  return *this;
}

prewarm_plan& prewarm_plan::kernel(const cubridge::kernel& k) {
  entries_.push_back({entry::kind::kernel, "kernel '" + k.name() + "' loaded", {k}, {}});
  return *this;
}

prewarm_plan& prewarm_plan::step(std::string what, std::function<void()> action) {
  CUBRIDGE_EXPECTS(static_cast<bool>(action), "prewarm step '" + what + "' has no action");
  entries_.push_back({entry::kind::custom, std::move(what), {}, std::move(action)});
  return *this;
}

namespace {

/// Loads a kernel in the current context; returns false if it was loaded already.
bool load_kernel(const kernel& k) {
  CUfunction function = k.launch_handle();
  if (k.source() == kernel::origin::library) {
    // The CUkernel's function in this context; the lookup loads the library here if needed.
    CUBRIDGE_CU(cuKernelGetFunction, (&function, reinterpret_cast<CUkernel>(k.launch_handle())),
                "kernel '" + k.name() + "' in the current context");
  }
  CUfunctionLoadingState state{};
  CUBRIDGE_CU(cuFuncIsLoaded, (&state, function), "kernel '" + k.name() + "'");
  if (state == CU_FUNCTION_LOADING_STATE_LOADED) return false;
  CUBRIDGE_CU(cuFuncLoad, (function), "loading kernel '" + k.name() + "'");
  return true;
}

}  // namespace

prewarm_report prewarm_plan::run(context_ref ctx) const {
  scoped_current guard(ctx);
  prewarm_report report;
  for (const auto& e : entries_) {
    const auto start = std::chrono::steady_clock::now();
    bool did_work = true;
    switch (e.type) {
      case entry::kind::runtime:
        // With ctx current, the runtime adopts it rather than the primary context.
        CUBRIDGE_CUDART(cudaFree(nullptr), "initialising the runtime in " + ctx.describe());
        break;
      case entry::kind::kernel:
        did_work = load_kernel(e.kernels.front());
        break;
      case entry::kind::custom:
        e.action();
        break;
    }
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    report.steps.push_back({e.what, took.count(), !did_work});
  }
  return report;
}

}  // namespace cubridge
