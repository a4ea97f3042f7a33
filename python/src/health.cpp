// Whether this process can still use the GPU (core/process_health.hpp), for a Python service:
// cubridge.health(), the exit policy and its exit code (docs/hot-swap.md, "A node that knows it
// is poisoned").
#include "bindings.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/core/process_health.hpp>

#include <nanobind/stl/string.h>

#include <chrono>
#include <cmath>
#include <string>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

nb::object health() {
  const auto record = process_health();
  if (!record) {
    // Poisoned without a record (it could not be built): still no None for a broken process.
    if (!process_poisoned()) return nb::none();
    nb::dict bare;
    bare["error"] = nb::none();
    bare["error_name"] = nb::none();
    bare["call"] = nb::none();
    bare["at"] = nb::none();
    bare["running"] = nb::list();
    return bare;
  }
  nb::list running;
  for (const auto& v : record->running) {
    nb::dict version;
    version["module"] = v.module;
    version["label"] = v.label;
    version["version_id"] = v.version_id;
    version["kernel"] = v.kernel.empty() ? nb::object(nb::none()) : nb::cast(v.kernel);
    running.append(version);
  }
  nb::dict out;
  out["error"] = static_cast<int>(record->error);
  out["error_name"] = record->error_name;
  out["call"] = record->call;
  out["at"] = std::chrono::duration<double>(record->at.time_since_epoch()).count();
  out["running"] = running;
  return out;
}

void exit_when_poisoned_after(double grace_s, int exit_code) {
  // Checked before the cast to milliseconds: a NaN or a huge value has no such count, and
  // -0.0004 would round to an accepted 0. The exit code is the C++ call's check.
  CUBRIDGE_EXPECTS(std::isfinite(grace_s) && grace_s >= 0 && grace_s < 1e9,
                   "exit_when_poisoned: grace_s " + std::to_string(grace_s) +
                       " is not a finite, non-negative number of seconds");
  const auto grace =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(grace_s));
  (void)exit_when_poisoned({.grace = grace, .exit_code = exit_code});
}

}  // namespace

void bind_health(nb::module_& m) {
  m.attr("POISONED_EXIT_CODE") = poisoned_exit_code;
  m.def("health", &health,
        "None while this process can use the GPU; once a sticky CUDA error (an illegal address, "
        "a launch failure, ...) poisoned it, for good, a dict: 'error' (the CUresult), "
        "'error_name' ('CUDA_ERROR_ILLEGAL_ADDRESS'), 'call' (what saw it), 'at' (unix "
        "seconds) and 'running' (the hot modules' versions serving then: 'module', 'label', "
        "'version_id', 'kernel' or None). The first such error any cubridge call sees marks the "
        "process; only a new process recovers.");
  m.def(
      "exit_when_poisoned", &exit_when_poisoned_after, nb::arg("grace_s") = 2.0,
      nb::arg("exit_code") = poisoned_exit_code,
      "Ends this process with `exit_code` (default POISONED_EXIT_CODE, 75) `grace_s` seconds "
      "after it is poisoned (counted from now if it is already), so that its supervisor (systemd's "
      "Restart=on-failure, Kubernetes) starts a fresh one; the grace lets the readiness probe "
      "answer 503 first. No Python cleanup runs (os._exit's way). Raises PreconditionError for "
      "an exit code outside 1..255 or a negative grace.");
}

}  // namespace cubridge::python
