#pragma once
// The state of a hot module, shared by its sources: hot_module.cpp (the version state, promote
// and rollback), hot_module_stage.cpp (staging a version against the interface),
// hot_module_reclaim.cpp (the reclaimer thread, sealing dying streams), hot_module_graphs.cpp
// (tracked graphs) and hot_kernel_launch.cpp (the launch path and its per-thread cache).
// Internal to the swap layer; not installed.

#include <cubridge/core/process_health.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cubridge {

namespace swap_internal {
class probation_session;
}  // namespace swap_internal

namespace hot_module_internal {

/// Largest launch configuration a kernel has been launched with: a new version must fit it.
struct launch_usage {
  std::atomic<unsigned long long> threads_per_block{0};
  std::atomic<unsigned> dynamic_shared_bytes{0};
};

/// Raises `slot` to `value` if it is smaller (hot_kernel::note_usage, on every launch).
template <class T>
void raise_to(std::atomic<T>& slot, T value) noexcept {
  T seen = slot.load(std::memory_order_relaxed);
  while (value > seen && !slot.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

/// A number no other hot module of this process has (hot_module.cpp).
std::uint64_t next_module_serial() noexcept;

/// What `k` allows (hot_module_stage.cpp).
kernel_limits limits_of(const kernel& k);

/// Refuses a hot launch (or graph launch) on the per-thread default stream, saying why
/// (hot_kernel_launch.cpp). @throws error (errc::precondition), always.
[[noreturn]] void refuse_per_thread_stream(const std::string& what);

/// Thrown inside a promote's lock when its label is not above the serving one
/// (promote_condition::label_above_serving): nothing switched. stage_and_promote() turns it into
/// apply_outcome::not_newer; it never leaves the swap layer.
struct not_newer : std::exception {
  not_newer(std::uint64_t label, std::uint64_t id) noexcept
      : serving_label(label), serving_id(id) {}
  [[nodiscard]] const char* what() const noexcept override {
    return "the staged version's label is not above the serving one";
  }
  std::uint64_t serving_label;
  std::uint64_t serving_id;
};

/// swap_target::stage_and_promote for a hot module or a group: `target.versions()` is asked
/// first, so that a version certain to be refused is never loaded; what counts is the compare
/// inside `promote(staged)`, whose not_newer becomes the refusal.
template <class Target, class Promote>
apply_result stage_and_promote(const Target& target, std::span<const std::byte> image,
                               const image_info* info, const stage_options& options,
                               promote_condition condition, Promote promote) {
  if (condition == promote_condition::label_above_serving) {
    const auto serving = target.versions().serving;
    if (options.label <= serving.origin.label)
      return {apply_outcome::not_newer, serving.origin.label, serving.id};
  }
  auto staged = info ? target.stage(image, *info, options) : target.stage(image, options);
  try {
    const auto id = promote(std::move(staged));
    return {apply_outcome::promoted, options.label, id};
  } catch (const not_newer& refused) {
    return {apply_outcome::not_newer, refused.serving_label, refused.serving_id};
  }
}

}  // namespace hot_module_internal

struct hot_module::state {
  /// Starts the stream listener and the reclaimer thread (hot_module.cpp).
  state(context_arg c, std::string n, std::vector<std::string> names, hot_version first,
        hot_module_options o);

  state(const state&) = delete;
  state& operator=(const state&) = delete;

  ~state();

  // The reclaim path (hot_module_reclaim.cpp).

  /// Counts a failure on the reclaim path and reports it; never throws.
  void report_reclaim_failure(const std::string& what) noexcept;
  /// Unloads what can be unloaded; never throws: failures are counted and reported.
  detail::reclaim_pass reclaim_now(std::size_t* unloaded = nullptr) noexcept;
  /// The NVTX message of a reclaim pass (the retired versions), empty when none is retired.
  std::string unload_trace() const;
  /// An event recorded on `s` now: complete once everything queued on `s` so far is.
  event last_event_on(CUstream s);
  /// `s` is about to be destroyed: every version that launched on it gets its last event now,
  /// while the handle is valid (reclaim could not record one later).
  void seal(CUstream s) noexcept;

  // Validation of a new version (hot_module_stage.cpp).

  [[noreturn]] void reject(const std::string& source, const std::string& cause);
  /// Why `v` cannot serve the launch shapes used so far ("kernel 'k' is launched with 1024
  /// threads per block, <who> allows 128"), or empty if it can.
  std::string misfit(const hot_version& v, const std::string& who) const;
  /// The kernel of interface index `index` in `staged`, if it takes the parameters `serving`
  /// takes; otherwise rejects the version from `source`.
  kernel staged_kernel(const module& staged, std::size_t index, const kernel& serving,
                       const std::string& source);
  /// Rejects the version from `source` unless each of `variables` is in both modules with the
  /// same size.
  void check_carried_globals(const module& serving, const module& staged,
                             const std::vector<std::string>& variables, const std::string& source);
  /// Puts `candidate` (loaded from `image`) on probation against `serving` if `options` asks
  /// for it (hot_module_probation.cpp); throws probation_error unless it passed.
  void run_probation(const stage_options& options, const hot_version& serving,
                     std::span<const std::byte> image, const std::string& source);
  /// Runs the smoke test of `options`, if any, on `staged`; rejects the version if it throws.
  void run_smoke_test(const stage_options& options, const module& staged,
                      const std::string& source);

  // Tracked graphs (hot_module_graphs.cpp).

  /// An instantiated graph that follows the current version.
  struct tracked_graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    std::string name;  // for messages: "graph 'name'", or "a graph" when empty
    std::vector<std::pair<CUgraphNode, std::size_t>> nodes;  // node, interface kernel index
    /// The version its nodes launch; 0 when unknown (a failed undo): launch_graph() retargets.
    std::uint64_t bound_version = 0;
    std::mutex mutex;  // a graph exec is not thread-safe: retarget and launch one at a time
  };

  /// "graph 'name'", or "a graph" for one tracked without a name (for messages).
  static std::string graph_name(const tracked_graph& g);
  /// Makes `node` of `g` launch `function`: in the instantiated graph first, then in the graph
  /// itself (so that later instantiations agree). `steps` counts what changed, for undo.
  void set_node_function(tracked_graph& g, CUgraphNode node, std::size_t index, CUfunction function,
                         std::uint64_t to_id, int& steps);
  /// Puts back what set_node_function changed (`steps`), pointing at `function`. Never throws;
  /// false if the driver refused.
  static bool restore_node_function(tracked_graph& g, CUgraphNode node, CUfunction function,
                                    int steps) noexcept;
  /// Points `g`'s nodes at version `to_id`'s kernels, if they point elsewhere (track_graph(),
  /// and launch_graph(), which retries after a failure), with the module's context current.
  /// Caller holds g.mutex (or owns a graph not listed yet).
  void retarget(tracked_graph& g, const hot_version& to, std::uint64_t to_id);
  /// Points every tracked graph at `to`, all or nothing: on a failure, every node changed so
  /// far is pointed back at `from` and the error rethrown (a graph whose undo the driver
  /// refused is marked unknown, for launch_graph() to retarget). Caller holds graphs_mutex and
  /// every graph's mutex, and sets bound_version once the switch is made.
  void retarget_all(const hot_version& from, const hot_version& to, std::uint64_t to_id);

  /// Runs a group's `inner` (hot_module::promote(version, inner)) once this module's own
  /// fallible work is done; if it throws, points the tracked graphs back at `from` (the
  /// serving version) and rethrows, so that nothing here switched. Caller holds the locks of
  /// `switching`.
  void run_inner(const std::function<void()>& inner, const hot_version& from);

  /// A switch (promote or rollback) under way: the swap mutex, the graph list and every
  /// tracked graph locked (no graph launches meanwhile), and the context current if needed.
  struct switching {
    explicit switching(state& s, bool needs_context) : swap(s.swap_mutex), list(s.graphs_mutex) {
      for (auto& g : s.graphs) each.emplace_back(g->mutex);
      if (needs_context || !s.graphs.empty()) current.emplace(s.ctx.ref());
    }
    std::lock_guard<std::mutex> swap;
    std::lock_guard<std::mutex> list;
    std::vector<std::unique_lock<std::mutex>> each;
    std::optional<scoped_current> current;
  };

  context_arg ctx;
  std::string name;
  // Staged versions name their module by it.
  const std::uint64_t serial = hot_module_internal::next_module_serial();
  std::vector<std::string> kernel_names;
  // Per kernel, same order as kernel_names.
  std::vector<hot_module_internal::launch_usage> usage;
  hot_kernel::chain versions;
  std::atomic<std::uint64_t> rejected{0};
  std::atomic<std::uint64_t> rollbacks{0};
  std::mutex swap_mutex;  // one promote or rollback at a time, before graphs_mutex
  std::mutex graphs_mutex;
  std::vector<std::unique_ptr<tracked_graph>> graphs;

  /// A kernel node a hot_kernel::capture() added to a stream capture's graph, remembered until
  /// track_graph() of that graph takes it (or a newer capture into the same handle drops it).
  struct captured_node {
    CUgraph graph;
    std::uint64_t capture_id;
    CUgraphNode node;
    std::size_t index;  // interface kernel index
  };
  /// Bounds the captures remembered but never tracked (an abandoned capture leaves its nodes).
  static constexpr std::size_t max_captured_nodes = 1u << 16;
  std::mutex captured_mutex;
  std::vector<captured_node> captured;
  /// Remembers the node a capture on `stream` just added for kernel `index` (hot_kernel::capture).
  void note_captured(CUstream stream, std::size_t index, const std::string& kernel_name);
  /// The captured nodes of `graph`, taken off the list.
  std::vector<captured_node> take_captured(CUgraph graph);

  hot_module_options options;
  std::atomic<std::uint64_t> reclaim_failures{0};
  std::mutex failure_mutex;
  std::string last_reclaim_failure;

  // What serves, for process_health's record (running_hot_versions): kept in atomics because
  // the record is made inside a failing driver call, which may run under the chain's lock.
  std::atomic<std::uint64_t> serving_label{0};
  std::atomic<std::uint64_t> serving_id{1};
  /// The interface index of the kernel launched last (written only when it changes).
  std::atomic<std::uint32_t> last_kernel{UINT32_MAX};
  // The live hot modules (hot_module_registry.cpp): the constructor lists this one (installing
  // process_health's provider with the first), the destructor takes it off.
  static void register_live(state* s);
  static void unregister_live(state* s) noexcept;
  /// What every live hot module serves; reads only atomics and names fixed at load, so it may
  /// run inside any failing driver call, under any of a hot module's locks.
  static std::vector<running_version> running_versions();
  /// Sets serving_label and serving_id after a switch.
  void note_serving(std::uint64_t id, std::uint64_t label) noexcept {
    serving_label.store(label, std::memory_order_relaxed);
    serving_id.store(id, std::memory_order_relaxed);
  }

  // The probation under way, if any (hot_module_probation.cpp). `probation_every` is what every
  // launch reads; the session itself is taken under the mutex only by sampled launches.
  std::atomic<std::uint32_t> probation_every{0};     // 0: not mirroring
  std::atomic<std::uint64_t> probation_launches{0};  // launches seen while mirroring
  std::mutex probation_mutex;
  std::shared_ptr<swap_internal::probation_session> probation;

  std::uint64_t stream_listener;  // removed first in ~state, before anything it uses dies

  detail::reclaim_signal signal;
  std::thread reclaimer;  // last: starts once everything above exists
};

}  // namespace cubridge
