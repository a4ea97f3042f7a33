#pragma once
// New versions of a hot module from a watched directory: a file dropped there is turned into
// machine code for the module's device (.cu through NVRTC, .ptx through nvJitLink, .cubin and
// .fatbin as they are), staged, and promoted. The driver never JITs: a serving process hands it
// machine code only (FACTS.md).

#include <cubridge/compile/compile.hpp>
#include <cubridge/compile/compile_cache.hpp>
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/swap/directory_watcher.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

namespace cubridge {

/// Machine code for a device of `target` from a file, by build_machine_code (machine_code.hpp)
/// with the kind its extension names: .cu compiled by NVRTC, with the file's directory first
/// among the include paths (as nvcc looks for quoted includes), .ptx linked by nvJitLink (both
/// through `cache` when given), .cubin / .fatbin as they are once checked to run on `target`.
/// @throws error (errc::precondition) for another extension, error (errc::io) for a file that
///         cannot be read, and as build_machine_code (compile_error with the compiler's log,
///         image_error for machine code with no code for `target`).
[[nodiscard]] std::vector<std::byte> machine_code_from_file(const std::filesystem::path& file,
                                                            compute_capability target,
                                                            compile_options options = {},
                                                            compile_cache* cache = nullptr);

/// The label a reloaded file carries: N for a name of the form "<stem>.v<N>.<ext>"
/// ("filters.v12.cu": 12), 0 for any other name.
[[nodiscard]] std::uint64_t label_of_file(const std::filesystem::path& file) noexcept;

/// Watches a directory and promotes every good file into `target` (see machine_code_from_file
/// and hot_module::stage). A refused file leaves the current version serving. A file named
/// with a version ("filters.v12.cu", label_of_file) is labelled with it and promoted only if
/// it is above the serving version's label (hot_module::stage_and_promote, compared inside the
/// promote's lock, as the update endpoint's and the fleet's pushes are); otherwise on_refused
/// gets a version_rejected_error naming both. Any other name is promoted whatever serves, with
/// label 0 (a developer's edit loop).
class hot_reloader {
 public:
  struct options {
    std::chrono::milliseconds debounce{200};
    compile_options compile{};  ///< for .cu files; architecture is set from the device
    /// Optional; shared with the reloader, which keeps it while it watches.
    std::shared_ptr<compile_cache> cache{};
    /// Smoke test etc.; source_name is set to the file, label to label_of_file() and signer
    /// to empty (a dropped file is no signed bundle): the chain records the version's origin as
    /// that file; the update endpoint sees an unlabelled one as serving no bundle version.
    stage_options stage{};
    /// Called with the file and the promoted version's chain id (hot_module_stats::current_id).
    std::function<void(const std::filesystem::path&, std::uint64_t id)> on_promoted;
    std::function<void(const std::filesystem::path&, std::exception_ptr)> on_refused;
  };

  /// Starts watching, holding a handle of `target` (hot_module is a shared handle) until it is
  /// destroyed. @throws error (errc::io) if the
  /// directory cannot be watched.
  hot_reloader(hot_module target, std::filesystem::path directory, options opts);
  ~hot_reloader();
  hot_reloader(const hot_reloader&) = delete;
  hot_reloader& operator=(const hot_reloader&) = delete;

 private:
  std::unique_ptr<directory_watcher> watcher_;
};

}  // namespace cubridge
