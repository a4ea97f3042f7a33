#pragma once
// Moves CUDA's lazy first-use costs out of a service's first request: under the default LAZY
// module loading the driver loads each kernel at its first launch (or lookup), the runtime sets
// itself up at its first call, libraries create their handles at first use. A prewarm plan names
// what a service will use; run() pays for all of it up front and reports what each step cost.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/launch_config.hpp>
#include <cubridge/core/stream_ref.hpp>

#include <functional>
#include <string>
#include <vector>

namespace cubridge {

/// What one prewarm step did and cost.
struct prewarm_step {
  std::string what{};         ///< e.g. "kernel 'fill_u32' loaded"
  double milliseconds = 0;    ///< host time the step took
  bool already_done = false;  ///< nothing was left to do (e.g. the kernel was already loaded)
};

/// Every step of one run(), in order.
struct prewarm_report {
  std::vector<prewarm_step> steps{};
  [[nodiscard]] double total_milliseconds() const noexcept;
};

/// The things a service will use, to be materialised ahead of its first request.
class prewarm_plan {
 public:
  /// Initialise the Runtime API in the context (what a first runtime call would pay).
  prewarm_plan& runtime();
  /// Load `k` in the context: cuFuncLoad for a module kernel; cuKernelGetFunction + cuFuncLoad
  /// for a library kernel (which also loads its library into the context).
  prewarm_plan& kernel(const cubridge::kernel& k);
  /// A warm-up launch the service knows to be harmless (e.g. on a scratch buffer, or with a
  /// count of zero), then a synchronize of its stream: pays what loading alone leaves to the
  /// first launch (the launch path's and the stream's first use, the first synchronize). The
  /// arguments are copied into the plan. @throws launch_argument_error now for a wrong list.
  template <class... Args>
  prewarm_plan& launch(const cubridge::kernel& k, const launch_config& config, Args... args) {
    (void)k.template typed<Args...>();  // check the argument list when the plan is made
    return step("warm-up launch of '" + k.name() + "'", [k, config, args...] {
      k.launch(config, args...);
      config.stream.synchronize();
    });
  }
  /// Any other first-use cost, e.g. `[&] { cublasCreate(&handle); }`; runs with the context
  /// current. Exceptions it throws propagate out of run().
  prewarm_plan& step(std::string what, std::function<void()> action);

  /// Runs every step in order with `ctx` current (the caller's context stack is restored).
  /// @throws error naming the step that failed.
  prewarm_report run(context_ref ctx) const;

 private:
  struct entry {
    enum class kind { runtime, kernel, custom } type;
    std::string what;
    std::vector<cubridge::kernel> kernels;  // one element for kind::kernel
    std::function<void()> action;
  };
  std::vector<entry> entries_;
};

}  // namespace cubridge
