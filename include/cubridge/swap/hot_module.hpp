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
// recorded on it then. Hot launches take a stream of their own or the legacy default stream;
// the per-thread default stream is refused (hot_kernel::launch says why). Give the driver
// machine code only: a PTX image makes the driver JIT in this process, which stalls every
// thread (FACTS.md); compile first.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/kernel_arguments.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/prewarm.hpp>
#include <cubridge/swap/error.hpp>
#include <cubridge/swap/probation.hpp>
#include <cubridge/swap/swap_target.hpp>
#include <cubridge/swap/version_chain.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace cubridge {

namespace detail {
/// Test seam (tests/test_hot_module.cpp): when set, called before every event the reclaim path
/// makes (for a retired version's stream, or a stream being destroyed); what it throws fails
/// that step as a refused cuEventCreate would. Unset (null) in production.
inline std::atomic<void (*)(CUstream)> reclaim_event_fault{nullptr};
}  // namespace detail

/// What a kernel of one version allows: the launch shapes in use must fit it.
struct kernel_limits {
  unsigned long long max_threads_per_block = 0;  ///< CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
  unsigned max_dynamic_shared_bytes = 0;  ///< CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
};

/// The hot launches of one version: counted on the launch path (relaxed atomics), read by
/// hot_module::launches() for health signals (a fleet node's heartbeat).
struct version_launch_counters {
  std::atomic<std::uint64_t> launches{0};  ///< launches the driver accepted
  std::atomic<std::uint64_t> failures{0};  ///< launches that threw (the driver refused them)
  /// The CUresult of the last failure that came from the driver (0: none yet).
  std::atomic<int> last_failure{0};
};

/// One loaded version: the module, its kernels and their limits, in the hot module's kernel
/// order, and its launch counters (shared: a version keeps its counts while it moves through the
/// chain).
struct hot_version {
  module loaded;  // always given: a module has no empty state
  std::vector<kernel> kernels{};
  std::vector<kernel_limits> limits{};
  std::shared_ptr<version_launch_counters> counters = std::make_shared<version_launch_counters>();
  /// The image it was loaded from: what a probation's worker loads as the serving version.
  std::shared_ptr<const std::vector<std::byte>> image{};
};

/// The serving version's launches since it was promoted (hot_module::launches()).
struct launch_tally {
  std::uint64_t version_id = 0;  ///< its chain id
  std::uint64_t label = 0;       ///< its label (the bundle version), 0 if none
  std::uint64_t launches = 0;
  std::uint64_t failures = 0;
  /// The driver's name of the last failure ("CUDA_ERROR_ILLEGAL_ADDRESS"), empty if none.
  std::string last_failure{};
  /// Whether that failure is one that poisons the context (an illegal address, a launch
  /// failure, a hardware exception): every later call in it fails the same way.
  bool sticky = false;
};

/// A version loaded and validated, not yet serving. Promote it into the hot module that staged
/// it, or drop it (which unloads it). A moved-from staged_version is refused by promote().
class staged_version {
 public:
  staged_version(staged_version&& other) noexcept
      : version_(std::move(other.version_)),
        carry_globals_(std::move(other.carry_globals_)),
        source_(std::move(other.source_)),
        origin_(std::move(other.origin_)),
        owner_(std::exchange(other.owner_, 0)),
        owner_name_(std::move(other.owner_name_)) {}
  staged_version& operator=(staged_version&& other) noexcept {
    if (this != &other) {
      version_ = std::move(other.version_);
      carry_globals_ = std::move(other.carry_globals_);
      source_ = std::move(other.source_);
      origin_ = std::move(other.origin_);
      owner_ = std::exchange(other.owner_, 0);
      owner_name_ = std::move(other.owner_name_);
    }
    return *this;
  }
  [[nodiscard]] const module& loaded() const noexcept { return version_.loaded; }
  /// Where it came from (stage_options::label, signer, source_name; the stage time).
  /// The chain keeps it with the version once promoted (hot_module::versions()).
  [[nodiscard]] const version_origin& origin() const noexcept { return origin_; }

 private:
  friend class hot_module;
  staged_version(hot_version v, std::vector<std::string> carry, std::string source,
                 version_origin origin, std::uint64_t owner, std::string owner_name) noexcept
      : version_(std::move(v)),
        carry_globals_(std::move(carry)),
        source_(std::move(source)),
        origin_(std::move(origin)),
        owner_(owner),
        owner_name_(std::move(owner_name)) {}
  hot_version version_;
  std::vector<std::string> carry_globals_;
  std::string source_;  // stage_options::source_name, for messages
  version_origin origin_;
  std::uint64_t owner_;     // the serial of the hot module that staged it; 0 once moved from
  std::string owner_name_;  // "module 'filters' in context 0x..."
};

/// What stage() checks beyond the kernels' presence and parameter layouts.
struct stage_options {
  /// Runs on the staged module before it can be promoted (e.g. launch a kernel on known input and
  /// compare); throwing anything rejects the version.
  std::function<void(const module&)> smoke_test{};
  /// Name for messages (e.g. the file it came from); the version's origin().source.
  std::string source_name{};
  /// The version's label (origin().label); 0: none. The update layer's sink
  /// (hot_module_sink.hpp) sets the signed bundle version and reads it back from the chain.
  std::uint64_t label = 0;
  /// Who vouched for the code (origin().signer); the sink sets the signing key's id in hex.
  std::string signer{};
  /// `__device__` variables whose contents promote() copies from the serving version into this
  /// one just before the switch (counters, tables). Each must exist in both with the same size.
  std::vector<std::string> carry_globals{};
  /// Put the version on probation (swap/probation.hpp) before stage() returns it: it must pass
  /// on mirrored live launches in a sandbox worker, or stage() throws probation_error. stage()
  /// blocks meanwhile (at most the policy's deadline); launches go on as before on other
  /// threads.
  std::optional<probation_policy> probation{};
};

/// Counters for reports.
struct hot_module_stats {
  /// The serving version's chain id (1 for the loaded one, +1 per promote; a rollback returns
  /// to an older id). Not a label: that is versions().serving.origin.label.
  std::uint64_t current_id = 0;
  /// Switches to another version: promote() and rollback() calls that switched.
  std::uint64_t promotions = 0;
  /// rollback() calls that switched (counted in `promotions` too).
  std::uint64_t rollbacks = 0;
  /// Versions refused by stage(), or by promote() for launch shapes that no longer fit.
  std::uint64_t rejected = 0;
  std::size_t retired_waiting = 0;  ///< old versions not yet unloaded: pinned, or being unloaded
  /// Versions unloaded so far (`retired_waiting` drops exactly as this grows).
  std::uint64_t unloaded = 0;
  /// Failures on the reclaim path so far: an event that could not be made or recorded, a
  /// context that could not be made current. A retired version they hit stays loaded until a
  /// later pass succeeds; a count that keeps growing with `retired_waiting` stuck means an
  /// unload that never happens.
  std::uint64_t reclaim_failures = 0;
  /// The latest of them, as given to hot_module_options::on_reclaim_failure; empty if none.
  std::string last_reclaim_failure{};
};

/// How a hot module reports what its background thread cannot throw.
struct hot_module_options {
  /// Called once for each reclaim failure (see hot_module_stats::reclaim_failures) with a
  /// message naming the module, the version or stream, and the driver's error. Runs on the
  /// thread that met it: the background reclaimer, a caller of reclaim(), or a thread
  /// destroying a stream (then it must not create or destroy streams itself). Exceptions it
  /// throws are ignored. It must not launch this module's kernels (it may run under a
  /// version's lock); reading stats() is fine. After a failure the background thread retries
  /// every 100 ms, not 1 ms.
  std::function<void(const std::string& message)> on_reclaim_failure{};
  /// Where the first version came from, e.g. {.label = 1} when its image is bundle
  /// version 1 (the update endpoint then refuses pushes of version 1 or below). An empty source
  /// becomes "load"; an unset staged_at, the load time.
  version_origin origin{};
};

class hot_kernel;
class hot_module_group;

/// A CUDA graph a hot module follows (hot_module::graphs()).
struct followed_graph {
  std::string name;  ///< as track_graph() was given it (may be empty)
  CUgraphExec exec = nullptr;
  std::uint64_t version = 0;  ///< the version its nodes launch; 0 if unknown (a failed undo)
  std::size_t nodes = 0;      ///< its kernel nodes that launch this module
};

/// The serving version of a hot module, pinned: launches through it (hot_kernel::launch with a
/// pinned_version) use this version whatever is promoted meanwhile, and it stays loaded while
/// the pin lives and until the work launched through it completed. For a step of several
/// launches that must all run one version. Cheap to copy.
class pinned_version {
 public:
  // Copies only: a moved-from pin would pin nothing.
  pinned_version(const pinned_version&) noexcept = default;
  pinned_version& operator=(const pinned_version&) noexcept = default;
  ~pinned_version() = default;

  /// The version's chain id.
  [[nodiscard]] std::uint64_t id() const noexcept { return lease_.id(); }

 private:
  friend class hot_module;
  friend class hot_kernel;
  using chain = version_chain<hot_version, CUstream, event>;
  pinned_version(chain::lease lease, std::uint64_t module_serial) noexcept
      : lease_(std::move(lease)), module_serial_(module_serial) {}
  chain::lease lease_;
  std::uint64_t module_serial_;  // the hot module it pins a version of
};

/// A versioned module, held by shared handle: copies name the same module (as its hot_kernels
/// do), and it is unloaded when the last handle and the last hot_kernel of it are gone. So what
/// serves updates into it (hot_module_sink, hot_reloader) keeps a copy and cannot outlive it.
/// Thread-safe: launches, stage, promote and rollback may run on any threads at once, through
/// any copy. Every member of a moved-from hot_module throws error (errc::precondition); its
/// hot_kernels and the other copies keep working.
class hot_module final : public swap_target {
 public:
  /// Loads the first version into `ctx`. Its kernels (from the image, see image.hpp) define the
  /// interface every later version must keep. @throws image_error, error as module::load.
  [[nodiscard]] static hot_module load(context_arg ctx, std::string name,
                                       std::span<const std::byte> image,
                                       hot_module_options options = {});

  hot_module(const hot_module&) noexcept = default;
  hot_module& operator=(const hot_module&) noexcept = default;
  hot_module(hot_module&&) noexcept = default;
  hot_module& operator=(hot_module&&) noexcept = default;
  ~hot_module() override;

  /// Loads `image` and validates it against the interface: every kernel present with the same
  /// parameter layout, launch configurations used so far still fit (threads per block, shared
  /// memory), and the smoke test passes. The serving version is untouched whatever happens.
  /// @throws version_rejected_error naming the cause; image_error for bad bytes or another GPU.
  [[nodiscard]] staged_version stage(std::span<const std::byte> image,
                                     const stage_options& options = {}) const;
  /// As stage(image, options), for bytes inspected already: `info` is what inspect_image(image)
  /// returned (verified_bundle::image for a pushed bundle), and the bytes are not parsed again.
  /// @throws as stage().
  [[nodiscard]] staged_version stage(std::span<const std::byte> image, const image_info& info,
                                     const stage_options& options = {}) const;
  /// Makes `version` current: every launch that starts after promote() returns uses it, on every
  /// thread; launches already issued finish on the version they started with. All or nothing:
  /// first the launch shapes used so far are checked against it again (launches since stage()
  /// may be wider), carried `__device__` variables are copied (work still running on the old
  /// version may change them after the copy) and tracked graphs are retargeted; if any of that
  /// fails, what was retargeted is put back, the staged version is dropped and the current
  /// version keeps serving. Returns its id.
  /// @throws error (errc::precondition) for a version staged by another hot module or moved
  ///         from; version_rejected_error for launch shapes it does not allow; error if a copy
  ///         or a graph update fails. Whatever it throws, nothing switched.
  std::uint64_t promote(staged_version version);
  /// Makes the previous version current again, all or nothing as promote() (launch shapes
  /// checked, tracked graphs retargeted). Returns its id.
  /// @throws error (errc::precondition) if there is none; version_rejected_error if it does not
  ///         allow a launch shape used since it served; error if a graph update fails. Whatever
  ///         it throws, nothing switched.
  std::uint64_t rollback() override;

  /// Stages `image` (inspected already as `*info`, or parsed here when null) and promotes it
  /// if `condition` holds when the switch is made: for label_above_serving, the new label is
  /// compared with the serving version's inside promote()'s own lock, so no other promoter can
  /// switch in between. A version refused as not_newer is unloaded and nothing switched.
  /// @throws as stage() and promote() (nothing switched).
  apply_result stage_and_promote(std::span<const std::byte> image, const image_info* info,
                                 const stage_options& options,
                                 promote_condition condition) override;

  /// Follows an instantiated CUDA graph whose kernel nodes launch kernels of this module: the
  /// nodes hot_kernel::capture() added to it while it was captured (a torch.cuda.graph, a
  /// stream capture), and the nodes that launch the serving version's kernels (e.g. added with
  /// hot_kernel::add_graph_node). They are pointed at the serving version now (a promote may
  /// have come between capture and instantiation) and after each promote or rollback
  /// (cuGraphExecKernelNodeSetParams, and the graph's own nodes so later instantiations agree).
  /// Launch it with launch_graph(), which keeps the version it ran loaded until that work
  /// completed. `graph` and `exec` must stay alive until untrack_graph(). `name` names the
  /// graph in errors ("graph 'name'"). @throws error (errc::precondition) if no node launches
  /// this module; error naming the graph if the driver refuses a node.
  void track_graph(CUgraph graph, CUgraphExec exec, std::string name = {});
  /// Stops following `exec`. Not concurrently with launch_graph(exec).
  void untrack_graph(CUgraphExec exec);
  /// Launches a tracked graph on `stream` (cuGraphLaunch), on the current version. Returns the
  /// id of the version it ran. @throws error naming the module and the graph; error
  /// (errc::precondition) for the per-thread default stream, as hot_kernel::launch.
  std::uint64_t launch_graph(CUgraphExec exec, stream_ref stream) const;
  /// As launch_graph(exec, stream), with `launch` enqueuing the graph on `stream` instead of
  /// cuGraphLaunch (torch's CUDAGraph.replay, which also advances the graph's random-number
  /// state). No promote or rollback switches this graph while `launch` runs, so a replay never
  /// runs a mix of old and new nodes, and the version it ran stays loaded until the work on
  /// `stream` completed. What `launch` throws passes (nothing was noted).
  std::uint64_t launch_graph(CUgraphExec exec, stream_ref stream,
                             const std::function<void()>& launch) const;
  /// The graphs followed now, each with its name, the version its nodes launch and how many.
  [[nodiscard]] std::vector<followed_graph> graphs() const;

  /// Pins the serving version for launches that must all run it (pinned_version).
  [[nodiscard]] pinned_version pin() const;

  /// Loads every kernel of the serving version in the module's context (prewarm_plan::kernel:
  /// cuFuncLoad under lazy loading), so that its first launch does not pay for it; a kernel
  /// loaded already (staging validates each kernel's limits, which loads it) is reported as
  /// already_done. A warm-up launch is the caller's: only it knows a harmless one.
  /// @throws error naming the kernel that failed to load.
  prewarm_report prewarm() const;

  /// The serving version, the rollback target and the retired versions not yet unloaded, each
  /// with its chain id and origin, at one instant: the one record of which version serves and
  /// which came before, whoever promoted (update endpoint, hot_reloader, a direct call).
  [[nodiscard]] held_versions versions() const override;

  /// The serving version's launches and launch failures since it was promoted, at one instant.
  [[nodiscard]] launch_tally launches() const;

  /// A kernel of the interface, launching whatever version is current at each launch.
  /// @throws error (errc::precondition) for a name the first version did not export.
  [[nodiscard]] hot_kernel get_kernel(std::string_view name) const;

  /// Copies the serving version's `__device__` variable `variable` into `out` (sizes must match),
  /// with the version pinned for the copy. Returns the id of the version read.
  /// @throws error naming the variable (missing, size mismatch, copy failure).
  std::uint64_t read_global(std::string_view variable, std::span<std::byte> out) const;

  [[nodiscard]] const std::string& name() const override;
  [[nodiscard]] context_ref context() const;
  /// The compute capability of the module's device.
  [[nodiscard]] compute_capability device_capability() const override;
  [[nodiscard]] hot_module_stats stats() const;
  /// stats() and launches() in the words of swap_target.
  [[nodiscard]] swap_counters counters() const override;
  /// Unloads whatever retired versions can be unloaded now (the background thread does this on
  /// its own; tests and shutdown call it to be sure). Returns how many were unloaded. Never
  /// throws for a failure on the way: it is counted and reported as the background thread's
  /// (hot_module_stats::reclaim_failures, hot_module_options::on_reclaim_failure).
  std::size_t reclaim() const;

 private:
  friend class hot_kernel;
  friend class hot_module_group;
  struct state;
  explicit hot_module(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}
  /// promote(version), with `inner` run after this module's fallible work (checks, carried
  /// variables, graph retargets) and before its switch: a group switches its other members
  /// there (generation_gate.hpp). If `inner` throws, the graphs are pointed back, nothing
  /// switched here, and the exception passes. An empty `inner` is promote(version). With
  /// label_above_serving, a label not above the serving one throws
  /// hot_module_internal::not_newer before anything else is done.
  std::uint64_t promote(staged_version version, const std::function<void()>& inner,
                        promote_condition condition = promote_condition::always);
  /// rollback(), with `inner` run as promote(version, inner) runs it.
  std::uint64_t rollback(const std::function<void()>& inner);
  /// The state; @throws error (errc::precondition) for a moved-from hot_module.
  [[nodiscard]] state& checked() const;
  std::shared_ptr<state> state_;
};

/// A kernel of a hot module: each launch takes the current version, launches its kernel and
/// notes the stream, so that the version is unloaded only after that work completed.
class hot_kernel {
 public:
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The interface's parameters, as the driver reports them (every version takes these).
  /// @throws error (errc::precondition) for a moved-from hot_kernel.
  [[nodiscard]] std::vector<parameter_info> parameters() const;

  /// Launches the current version's kernel with `args` (checked as kernel::launch checks them;
  /// one kernel_arguments list assembled at run time is checked the same way).
  /// Returns the id of the version that ran. The stream is a stream of the module's context or
  /// the legacy default stream (one per context, so the event the reclaimer records on it
  /// later follows this launch). The per-thread default stream is refused: it is another
  /// stream on every thread, and the reclaimer's event on its own thread's would not follow
  /// this one's work. @throws launch_argument_error; error (errc::precondition) for the
  /// per-thread default stream, a moved-from stream or a moved-from hot_kernel; error.
  template <class... Args>
  std::uint64_t launch(const launch_config& config, const Args&... args) const {
    auto lease = acquire(config);
    try {
      if (probation_every_->load(std::memory_order_relaxed) != 0) [[unlikely]]
        if (sampled()) mirror(lease, config, args...);
      lease.payload().kernels[index_].launch(config, args...);
    } catch (...) {
      count_failure(lease.payload());
      throw;
    }
    finish(lease, config);
    return lease.id();
  }

  /// As launch(config, args...), into the stream capture `config.stream` is under (a
  /// torch.cuda.graph, a cuStreamBeginCapture): the kernel node it adds is remembered, so that
  /// hot_module::track_graph() of the graph the capture makes follows that node, whatever
  /// version serves by then. The version it captured is not kept loaded for the graph until the
  /// graph is tracked: track it before its first launch. Never mirrored for a probation.
  /// Returns the id of the version it captured. @throws error (errc::precondition) if the stream
  /// is not capturing; as launch(config, args...).
  template <class... Args>
  std::uint64_t capture(const launch_config& config, const Args&... args) const {
    auto lease = acquire(config);
    expect_capturing(config);
    launch_counted(lease, config, args...);
    captured(lease, config);
    return lease.id();
  }

  /// As launch(config, args...), on the version `pinned` holds (hot_module::pin()) instead of
  /// the current one. Returns its id. @throws error (errc::precondition) for a version pinned
  /// from another hot module; as launch(config, args...).
  template <class... Args>
  std::uint64_t launch(const pinned_version& pinned, const launch_config& config,
                       const Args&... args) const {
    const auto& lease = checked_pin(pinned, config);
    launch_counted(lease, config, args...);
    finish(lease, config);
    return lease.id();
  }

  /// Adds a kernel node to `graph` that launches the current version with `args` (checked as
  /// launch() checks them; their values are copied into the node). Track the instantiated graph
  /// with hot_module::track_graph. The config's stream and cluster are not used (give
  /// stream_ref::legacy_default()). @throws launch_argument_error, error.
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
  hot_kernel(std::shared_ptr<hot_module::state> s, std::size_t index, std::string name) noexcept;
  /// The current version, pinned. @throws error (errc::precondition) for a moved-from
  /// hot_kernel.
  [[nodiscard]] chain::lease acquire() const;
  /// As acquire(), for a launch on `config.stream`; refuses the per-thread default stream.
  [[nodiscard]] chain::lease acquire(const launch_config& config) const;
  /// The lease of `pinned` for a launch on `config.stream`, checked: a version of this module,
  /// not the per-thread default stream.
  [[nodiscard]] const chain::lease& checked_pin(const pinned_version& pinned,
                                                const launch_config& config) const;
  /// A launch's finish: notes its stream for the reclaimer (once per thread and stream) and
  /// counts it.
  void finish(const chain::lease& lease, const launch_config& config) const;
  /// Counts a launch against its version: usage (the shapes later versions must fit), the
  /// last kernel launched (process_health's suspect) and the version's launch counter.
  void count_launch(const chain::lease& lease, const launch_config& config) const;
  /// Refuses a capture() on a stream that is not capturing (hot_module_graphs.cpp).
  void expect_capturing(const launch_config& config) const;
  /// A capture()'s finish: counts it and remembers its node (not the stream: the reclaimer's
  /// event on a capturing stream would join the capture).
  void captured(const chain::lease& lease, const launch_config& config) const;
  /// While a probation mirrors launches (probation_every_ not 0): counts the launch, and says
  /// whether it is one to mirror (hot_module_probation.cpp).
  [[nodiscard]] bool sampled() const noexcept;
  /// Hands a launch of the serving version to the probation (hot_module_probation.cpp).
  template <class... Args>
  void mirror(const chain::lease& lease, const launch_config& config, const Args&... args) const {
    const auto& k = lease.payload().kernels[index_];
    if constexpr (sizeof...(Args) == 1 && (std::is_same_v<Args, kernel_arguments> && ...)) {
      // A list assembled at run time: mirrored only if it fits the parameters (the launch
      // itself refuses it otherwise).
      const kernel_arguments& list = std::get<0>(std::tie(args...));
      const auto sizes = list.sizes();
      const auto params = k.parameters();
      if (sizes.size() != params.size()) return;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        if (sizes[i] != params[i].size) return;
      mirror_raw(lease, config, list.pointers());
    } else {
      (void)k.template typed<Args...>();  // the argument check, before anything is copied
      detail::with_kernel_arguments([&](void** arguments) { mirror_raw(lease, config, arguments); },
                                    args...);
    }
  }
  void mirror_raw(const chain::lease& lease, const launch_config& config, void** arguments) const;
  /// Counts a launch that threw against its version (in a catch block: reads the exception).
  static void count_failure(const hot_version& version) noexcept;
  /// Launches `lease`'s kernel, counting a failure against that version before it passes.
  template <class... Args>
  void launch_counted(const chain::lease& lease, const launch_config& config,
                      const Args&... args) const {
    try {
      lease.payload().kernels[index_].launch(config, args...);
    } catch (...) {
      count_failure(lease.payload());
      throw;
    }
  }
  /// Raises the launch configuration a new version must fit (stage(), promote() and rollback()
  /// check it) to `config`.
  void note_usage(const launch_config& config) const noexcept;
  CUgraphNode add_node(CUgraph graph, const kernel& k, const launch_config& config,
                       void** arguments) const;
  std::shared_ptr<hot_module::state> state_;
  /// The module's probation sampling rate (0: no probation), read by every launch: one relaxed
  /// load in the launch path, inline.
  const std::atomic<std::uint32_t>* probation_every_;
  std::size_t index_;
  std::string name_;
};

}  // namespace cubridge
