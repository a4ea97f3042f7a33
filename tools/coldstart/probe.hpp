#pragma once
// The child of `cubridge coldstart`: `cubridge coldstart-probe` (a hidden subcommand) pays one
// start of a CUDA program, phase by phase, timing each with std::chrono::steady_clock around the
// raw calls, and reports on stdout:
//   "phase <key>"        before each phase (the parent's progress display, and which phase a
//                        crash or hang happened in)
//   "{...}"              one JSON line at the end: a run_result (or, with --info, the machine)
// Exit status: 0 measured, 69 no driver / no device, 1 a phase failed (the JSON says which).

#include <string>
#include <string_view>

namespace cubridge::tool::coldstart {

struct probe_options {
  bool info = false;       ///< report the machine (GPU, driver, NVRTC, cuBLAS) only
  std::string scenario;    ///< a scenarios() key
  std::string loading;     ///< "lazy" / "eager": echoed; the mode itself comes from the
                           ///< environment (CUDA_MODULE_LOADING), set by the parent
  std::string cubin_path;  ///< the cubin for cubin / ctx-create
  std::string ptx_path;    ///< the PTX for ptx-cold / ptx-warm
  int device = 0;
  long long spawned_at_ns = 0;  ///< parent's steady_clock just before spawning; 0: not measured
};

/// Runs the probe in this process; returns the exit status. Never throws.
int run_probe(const probe_options& options) noexcept;

/// The driver release ("580.159.04") in the first line of /proc/driver/nvidia/version, which
/// reads "... Kernel Module  580.159.04  ..." or "... Open Kernel Module for x86_64  580.159.04
/// ...": the first word made of digits and dots with a dot in it. Empty if there is none.
[[nodiscard]] std::string parse_driver_release(std::string_view version_line);

}  // namespace cubridge::tool::coldstart
