#pragma once
// A named, versioned module in a context that can be replaced while kernels of it keep
// launching: stage (load + validate off the serving path), promote (atomic switch), rollback.
//
//   auto filters = cubridge::hot_module::load(ctx, "filters", v1_cubin);
//   auto blur = filters.get_kernel("blur");            // always launches the current version
//   blur.launch(config, in, out, n);                   // on any thread
//   ...
//   auto v2 = filters.stage(v2_cubin);                 // throws version_rejected_error if bad
//   filters.promote(std::move(v2));                    // launches from now on use v2
//   filters.rollback();                                // back to v1 in one call
//
// Old versions are unloaded on a background thread once no launch can still use them: no lease
// (host side) pins them, and an event recorded after their last launch on every stream they
// used has completed (version_chain.hpp). A stream that launched hot kernels must be destroyed
// through cubridge::stream, or after before_stream_destroy() (stream.hpp): the last event is
// recorded on it then. Give the driver machine code only: a PTX image makes
// the driver JIT in this process, which stalls every thread (FACTS.md); compile first.

#include <cubridge/context_ref.hpp>
#include <cubridge/event.hpp>
#include <cubridge/kernel.hpp>
#include <cubridge/module.hpp>
#include <cubridge/version_chain.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace cubridge {

/// One loaded version: the module and its kernels, in the hot module's kernel order.
struct hot_version {
  module loaded;
  std::vector<kernel> kernels;
};

/// A version loaded and validated, not yet serving. Promote it or drop it (which unloads it).
class staged_version {
 public:
  staged_version(staged_version&&) noexcept = default;
  staged_version& operator=(staged_version&&) noexcept = default;
  [[nodiscard]] const module& loaded() const noexcept { return version_.loaded; }

 private:
  friend class hot_module;
  staged_version(hot_version v, std::vector<std::string> carry) noexcept
      : version_(std::move(v)), carry_globals_(std::move(carry)) {}
  hot_version version_;
  std::vector<std::string> carry_globals_;
};

/// What stage() checks beyond the kernels' presence and parameter layouts.
struct stage_options {
  /// Runs on the staged module before it can be promoted (e.g. launch a kernel on known input and
  /// compare); throwing anything rejects the version.
  std::function<void(const module&)> smoke_test;
  /// Name for messages (e.g. the file it came from).
  std::string source_name;
  /// `__device__` variables whose contents promote() copies from the serving version into this
  /// one just before the switch (counters, tables). Each must exist in both with the same size.
  std::vector<std::string> carry_globals;
};

/// Counters for reports.
struct hot_module_stats {
  std::uint64_t current_version = 0;
  std::uint64_t promotions = 0;
  std::uint64_t rejected = 0;
  std::size_t retired_waiting = 0;  ///< old versions not yet unloaded: pinned, or being unloaded
  /// Versions unloaded so far (`retired_waiting` drops exactly as this grows).
  std::uint64_t unloaded = 0;
};

class hot_kernel;

/// Owning, move-only versioned module. Thread-safe: launches, stage, promote and rollback may run
/// on any threads at once.
class hot_module {
 public:
  /// Loads the first version into `ctx`. Its kernels (from the image, see image.hpp) define the
  /// interface every later version must keep. @throws image_error, error as module::load.
  [[nodiscard]] static hot_module load(context_arg ctx, std::string name,
                                       std::span<const std::byte> image);

  hot_module(hot_module&&) noexcept = default;
  hot_module& operator=(hot_module&&) noexcept = default;
  ~hot_module();

  /// Loads `image` and validates it against the interface: every kernel present with the same
  /// parameter layout, launch configurations used so far still fit (threads per block, shared
  /// memory), and the smoke test passes. The serving version is untouched whatever happens.
  /// @throws version_rejected_error naming the cause; image_error for bad bytes or another GPU.
  [[nodiscard]] staged_version stage(std::span<const std::byte> image,
                                     const stage_options& options = {}) const;
  /// Makes `version` current: every launch that starts after promote() returns uses it, on every
  /// thread; launches already issued finish on the version they started with. Carried
  /// `__device__` variables are copied first (work still running on the old version may change
  /// them after the copy). Returns its id. @throws error if a copy fails (nothing switched).
  std::uint64_t promote(staged_version version);
  /// Makes the previous version current again. Returns its id. @throws error if there is none.
  std::uint64_t rollback();

  /// Follows an instantiated CUDA graph whose kernel nodes launch kernels of this module (e.g.
  /// added with hot_kernel::add_graph_node): after each promote or rollback its nodes are
  /// retargeted to the current version (cuGraphExecKernelNodeSetParams, and the graph's own
  /// nodes so later instantiations agree). Launch it with launch_graph(), which keeps the
  /// version it ran loaded until that work completed. `graph` and `exec` must stay alive until
  /// untrack_graph(). @throws error (errc::precondition) if no node launches this module.
  void track_graph(CUgraph graph, CUgraphExec exec);
  /// Stops following `exec`. Not concurrently with launch_graph(exec).
  void untrack_graph(CUgraphExec exec);
  /// Launches a tracked graph on `stream` (cuGraphLaunch), on the current version. Returns the
  /// id of the version it ran. @throws error naming the module and the graph.
  std::uint64_t launch_graph(CUgraphExec exec, stream_ref stream) const;

  /// A kernel of the interface, launching whatever version is current at each launch.
  /// @throws error (errc::precondition) for a name the first version did not export.
  [[nodiscard]] hot_kernel get_kernel(std::string_view name) const;

  /// Copies the serving version's `__device__` variable `variable` into `out` (sizes must match),
  /// with the version pinned for the copy. Returns the id of the version read.
  /// @throws error naming the variable (missing, size mismatch, copy failure).
  std::uint64_t read_global(std::string_view variable, std::span<std::byte> out) const;

  [[nodiscard]] const std::string& name() const noexcept;
  [[nodiscard]] context_ref context() const noexcept;
  [[nodiscard]] hot_module_stats stats() const;
  /// Unloads whatever retired versions can be unloaded now (the background thread does this on
  /// its own; tests and shutdown call it to be sure). Returns how many were unloaded.
  std::size_t reclaim() const;

 private:
  friend class hot_kernel;
  struct state;
  explicit hot_module(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

/// A kernel of a hot module: each launch takes the current version, launches its kernel and
/// notes the stream, so that the version is unloaded only after that work completed.
class hot_kernel {
 public:
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Launches the current version's kernel with `args` (checked as kernel::launch checks them).
  /// Returns the id of the version that ran. @throws launch_argument_error, error.
  template <class... Args>
  std::uint64_t launch(const launch_config& config, const Args&... args) const {
    auto lease = acquire();
    lease.payload().kernels[index_].launch(config, args...);
    finish(lease, config);
    return lease.id();
  }

  /// Adds a kernel node to `graph` that launches the current version with `args` (checked as
  /// launch() checks them; their values are copied into the node). Track the instantiated graph
  /// with hot_module::track_graph. The config's stream and cluster are not used.
  /// @throws launch_argument_error, error.
  template <class... Args>
  CUgraphNode add_graph_node(CUgraph graph, const launch_config& config,
                             const Args&... args) const {
    auto lease = acquire();
    const auto& k = lease.payload().kernels[index_];
    (void)k.template typed<Args...>();  // the argument check
    return detail::with_kernel_arguments(
        [&](void** arguments) { return add_node(graph, k, config, arguments); }, args...);
  }

 private:
  friend class hot_module;
  using chain = version_chain<hot_version, CUstream, event>;
  hot_kernel(std::shared_ptr<hot_module::state> s, std::size_t index, std::string name) noexcept
      : state_(std::move(s)), index_(index), name_(std::move(name)) {}
  [[nodiscard]] chain::lease acquire() const;
  void finish(const chain::lease& lease, const launch_config& config) const;
  /// Raises the launch configuration a new version must fit (stage() checks it) to `config`.
  void note_usage(const launch_config& config) const noexcept;
  CUgraphNode add_node(CUgraph graph, const kernel& k, const launch_config& config,
                       void** arguments) const;
  std::shared_ptr<hot_module::state> state_;
  std::size_t index_;
  std::string name_;
};

}  // namespace cubridge
