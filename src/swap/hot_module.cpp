#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/detail/stream_listeners.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <cubridge/core/detail/describe.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

namespace cubridge {

namespace {

/// Largest launch configuration a kernel has been launched with: a new version must fit it.
struct launch_usage {
  std::atomic<unsigned long long> threads_per_block{0};
  std::atomic<unsigned> dynamic_shared_bytes{0};
};

template <class T>
void raise_to(std::atomic<T>& slot, T value) noexcept {
  T seen = slot.load(std::memory_order_relaxed);
  while (value > seen && !slot.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

std::uint64_t next_module_serial() noexcept {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

kernel_limits limits_of(const kernel& k) {
  return {static_cast<unsigned long long>(k.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)),
          static_cast<unsigned>(k.attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES))};
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

std::vector<std::string> interface_of(const image_info& info, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& k : info.kernels) names.push_back(k.name);
  if (names.empty())
    detail::throw_errc(errc::precondition, "hot_module::load",
                       "module '" + name +
                           "': the first version exports no kernel that the "
                           "image inspector can see (an image of no kernels, or only LTO IR?)");
  return names;
}

/// The loaded version's origin: as given, with "load" and the load time where unset.
version_origin first_origin(version_origin origin) {
  if (origin.source.empty()) origin.source = "load";
  if (origin.staged_at == std::chrono::system_clock::time_point{})
    origin.staged_at = std::chrono::system_clock::now();
  return origin;
}

}  // namespace

struct hot_module::state {
  state(context_arg c, std::string n, std::vector<std::string> names, hot_version first,
        hot_module_options o)
      : ctx(std::move(c)),
        name(std::move(n)),
        kernel_names(std::move(names)),
        usage(kernel_names.size()),
        versions(std::move(first), first_origin(o.origin)),
        options(std::move(o)),
        stream_listener(detail::add_stream_listener([this](CUstream s) { seal(s); })),
        reclaimer([this] {
          detail::run_reclaimer(
              signal, [this] { return reclaim_now(); }, std::chrono::milliseconds(1),
              std::chrono::milliseconds(100), [] {});
        }) {}

  state(const state&) = delete;
  state& operator=(const state&) = delete;

  ~state() {
    detail::remove_stream_listener(stream_listener);
    signal.stop();
    reclaimer.join();
  }

  /// Counts a failure on the reclaim path and reports it; never throws.
  void report_reclaim_failure(const std::string& what) noexcept {
    reclaim_failures.fetch_add(1);
    try {
      const std::string message = "module '" + name + "': " + what;
      {
        std::lock_guard lock(failure_mutex);
        last_reclaim_failure = message;
      }
      if (options.on_reclaim_failure) options.on_reclaim_failure(message);
    } catch (...) {
      // Out of memory, or the callback threw: the count above still shows it.
    }
  }

  /// Unloads what can be unloaded; never throws: failures are counted and reported.
  detail::reclaim_pass reclaim_now(std::size_t* unloaded = nullptr) noexcept {
    detail::reclaim_pass pass;
    try {
      scoped_current current(ctx.ref());
      const auto n = versions.reclaim(
          [](const event& e) {
            // Done, or failed for good (a sticky fault): either way nothing more will run.
            return driver::api().cuEventQuery(e.get()) != CUDA_ERROR_NOT_READY;
          },
          [this](const CUstream& s) { return last_event_on(s); },
          [&](std::uint64_t id, std::exception_ptr e) {
            pass.failed = true;
            report_reclaim_failure("retired version " + std::to_string(id) +
                                   " stays loaded for now: " + what_of(e));
          });
      if (unloaded) *unloaded = n;
    } catch (...) {
      pass.failed = true;
      report_reclaim_failure("reclaiming retired versions: " + what_of(std::current_exception()));
    }
    try {
      pass.waiting = versions.get_stats().retired != 0;
    } catch (...) {
      pass.waiting = true;  // a mutex failure: poll rather than sleep for good
    }
    return pass;
  }

  /// An event recorded on `s` now: complete once everything queued on `s` so far is.
  event last_event_on(CUstream s) {
    if (const auto fault = detail::reclaim_event_fault.load()) [[unlikely]]
      fault(s);
    auto e = event::create(ctx);
    // If the driver refuses (a raw stream destroyed without before_stream_destroy()), its queued
    // work still runs to the end: wait for the whole context, on this (non-serving) thread, and
    // return the never-recorded event, which queries as complete. Failing would pin the version.
    if (const CUresult r = driver::api().cuEventRecord(e.get(), s); r != CUDA_SUCCESS) {
      report_reclaim_failure("cuEventRecord " + detail::driver_error_name(r) +
                             ": recording the last event of a retired version on stream " +
                             detail::hex(s) +
                             " (destroyed without before_stream_destroy()?); waited for the "
                             "whole context instead");
      (void)driver::api().cuCtxSynchronize();
    }
    return e;
  }

  /// `s` is about to be destroyed: every version that launched on it gets its last event now,
  /// while the handle is valid (reclaim could not record one later).
  void seal(CUstream s) noexcept {
    try {
      // Most destroyed streams never launched this module: push its context only for one that did.
      versions.seal_stream(s, [this](const CUstream& stream) {
        scoped_current current(ctx.ref());
        return last_event_on(stream);
      });
    } catch (...) {
      // Out of events or a broken context: the reclaimer records on the dead handle later and,
      // refused, waits for the whole context.
      report_reclaim_failure("sealing stream " + detail::hex(s) +
                             " before its destruction: " + what_of(std::current_exception()));
    }
  }

  [[noreturn]] void reject(const std::string& source, const std::string& cause) {
    rejected.fetch_add(1);
    throw version_rejected_error("hot_module::stage", "module '" + name + "' version from " +
                                                          source + ": " + cause +
                                                          "; the current version keeps serving");
  }

  /// Why `v` cannot serve the launch shapes used so far ("kernel 'k' is launched with 1024
  /// threads per block, <who> allows 128"), or empty if it can.
  std::string misfit(const hot_version& v, const std::string& who) const {
    for (std::size_t i = 0; i < kernel_names.size(); ++i) {
      const auto threads = usage[i].threads_per_block.load();
      if (threads > v.limits[i].max_threads_per_block)
        return "kernel '" + kernel_names[i] + "' is launched with " + std::to_string(threads) +
               " threads per block, " + who + " allows " +
               std::to_string(v.limits[i].max_threads_per_block);
      const auto shared = usage[i].dynamic_shared_bytes.load();
      if (shared > v.limits[i].max_dynamic_shared_bytes)
        return "kernel '" + kernel_names[i] + "' is launched with " + std::to_string(shared) +
               " bytes of dynamic shared memory, " + who + " allows " +
               std::to_string(v.limits[i].max_dynamic_shared_bytes);
    }
    return {};
  }

  /// An instantiated graph that follows the current version.
  struct tracked_graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    std::vector<std::pair<CUgraphNode, std::size_t>> nodes;  // node, interface kernel index
    /// The version its nodes launch; 0 when unknown (a failed undo): launch_graph() retargets.
    std::uint64_t bound_version = 0;
    std::mutex mutex;  // a graph exec is not thread-safe: retarget and launch one at a time
  };

  /// Makes `node` of `g` launch `function`: in the instantiated graph first, then in the graph
  /// itself (so that later instantiations agree). `steps` counts what changed, for undo.
  void set_node_function(tracked_graph& g, CUgraphNode node, std::size_t index, CUfunction function,
                         std::uint64_t to_id, int& steps) {
    const auto what = [&] {
      return "kernel node of '" + kernel_names[index] + "' in a graph of module '" + name +
             "', retargeted to version " + std::to_string(to_id);
    };
    CUDA_KERNEL_NODE_PARAMS params{};
    CUBRIDGE_CU(cuGraphKernelNodeGetParams, (node, &params), what());
    params.func = function;
    params.kern = nullptr;
    params.ctx = nullptr;
    CUBRIDGE_CU(cuGraphExecKernelNodeSetParams, (g.exec, node, &params), what());
    steps = 1;
    // After the exec: a node's update may free the argument storage `params` points into.
    CUBRIDGE_CU(cuGraphKernelNodeSetParams, (node, &params), what());
    steps = 2;
  }

  /// Puts back what set_node_function changed (`steps`), pointing at `function`. Never throws;
  /// false if the driver refused.
  static bool restore_node_function(tracked_graph& g, CUgraphNode node, CUfunction function,
                                    int steps) noexcept {
    const auto& cu = driver::api();
    CUDA_KERNEL_NODE_PARAMS params{};
    if (cu.cuGraphKernelNodeGetParams(node, &params) != CUDA_SUCCESS) return false;
    params.func = function;
    params.kern = nullptr;
    params.ctx = nullptr;
    if (steps >= 1 && cu.cuGraphExecKernelNodeSetParams(g.exec, node, &params) != CUDA_SUCCESS)
      return false;
    if (steps >= 2 && cu.cuGraphKernelNodeSetParams(node, &params) != CUDA_SUCCESS) return false;
    return true;
  }

  /// Points `g`'s nodes at version `to_id`'s kernels, if they point elsewhere (launch_graph(),
  /// which retries after a failure). Caller holds g.mutex.
  void retarget(tracked_graph& g, const hot_version& to, std::uint64_t to_id) {
    if (g.bound_version == to_id) return;
    for (const auto& [node, index] : g.nodes) {
      int steps = 0;
      set_node_function(g, node, index, to.kernels[index].launch_handle(), to_id, steps);
    }
    g.bound_version = to_id;
  }

  /// Points every tracked graph at `to`, all or nothing: on a failure, every node changed so
  /// far is pointed back at `from` and the error rethrown (a graph whose undo the driver
  /// refused is marked unknown, for launch_graph() to retarget). Caller holds graphs_mutex and
  /// every graph's mutex, and sets bound_version once the switch is made.
  void retarget_all(const hot_version& from, const hot_version& to, std::uint64_t to_id) {
    struct change {
      tracked_graph* graph;
      CUgraphNode node;
      std::size_t index;
      int steps;
    };
    std::vector<change> changes;
    try {
      for (auto& g : graphs) {
        if (g->bound_version == to_id) continue;
        for (const auto& [node, index] : g->nodes) {
          changes.push_back({g.get(), node, index, 0});
          set_node_function(*g, node, index, to.kernels[index].launch_handle(), to_id,
                            changes.back().steps);
        }
      }
    } catch (...) {
      for (auto it = changes.rbegin(); it != changes.rend(); ++it)
        if (it->steps > 0 &&
            !restore_node_function(*it->graph, it->node, from.kernels[it->index].launch_handle(),
                                   it->steps))
          it->graph->bound_version = 0;  // unknown: launch_graph() retargets before launching
      throw;
    }
  }

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
  const std::uint64_t serial = next_module_serial();  // staged versions name their module by it
  std::vector<std::string> kernel_names;
  std::vector<launch_usage> usage;  // per kernel, same order as kernel_names
  hot_kernel::chain versions;
  std::atomic<std::uint64_t> rejected{0};
  std::mutex swap_mutex;  // one promote or rollback at a time, before graphs_mutex
  std::mutex graphs_mutex;
  std::vector<std::unique_ptr<tracked_graph>> graphs;

  hot_module_options options;
  std::atomic<std::uint64_t> reclaim_failures{0};
  std::mutex failure_mutex;
  std::string last_reclaim_failure;

  std::uint64_t stream_listener;  // removed first in ~state, before anything it uses dies

  detail::reclaim_signal signal;
  std::thread reclaimer;  // last: starts once everything above exists
};

hot_module hot_module::load(context_arg ctx, std::string name, std::span<const std::byte> image,
                            hot_module_options options) {
  const auto info = inspect_image(image);  // once, for the interface and the loader
  auto names = interface_of(info, name);
  auto loaded = module::load(ctx, image, info, {.name = name + " v1"});
  hot_version first{std::move(loaded), {}, {}};
  for (const auto& k : names) {
    first.kernels.push_back(first.loaded.get_kernel(k));
    first.limits.push_back(limits_of(first.kernels.back()));
  }
  return hot_module(std::make_shared<state>(std::move(ctx), std::move(name), std::move(names),
                                            std::move(first), std::move(options)));
}

hot_module::~hot_module() = default;

hot_module::state& hot_module::checked() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from hot_module: it has no module any more");
  return *state_;
}

staged_version hot_module::stage(std::span<const std::byte> image,
                                 const stage_options& options) const {
  auto& s = checked();
  std::optional<image_info> info;
  try {
    info.emplace(inspect_image(image));
  } catch (const image_error&) {
    s.rejected.fetch_add(1);
    throw;
  }
  return stage(image, *info, options);
}

staged_version hot_module::stage(std::span<const std::byte> image, const image_info& info,
                                 const stage_options& options) const {
  auto& s = checked();
  const std::string source = options.source_name.empty() ? "memory" : options.source_name;
  std::optional<module> loaded;
  try {
    loaded.emplace(
        module::load(s.ctx, image, info, {.name = s.name + " (staged from " + source + ")"}));
  } catch (const image_error&) {
    s.rejected.fetch_add(1);
    throw;
  }
  // The interface: the same kernels with the same parameters, fitting the launches in use.
  const auto current = s.versions.acquire();
  hot_version staged{std::move(*loaded), {}, {}};
  for (std::size_t i = 0; i < s.kernel_names.size(); ++i) {
    const auto& kname = s.kernel_names[i];
    std::optional<kernel> k;
    try {
      k.emplace(staged.loaded.get_kernel(kname));
    } catch (const error&) {
      s.reject(source, "kernel '" + kname + "' is missing");
    }
    const auto before = current.payload().kernels[i].parameters();
    const auto after = k->parameters();
    if (before.size() != after.size())
      s.reject(source, "kernel '" + kname + "' took " + std::to_string(before.size()) +
                           " parameters, now " + std::to_string(after.size()));
    for (std::size_t p = 0; p < before.size(); ++p)
      if (before[p].size != after[p].size || before[p].offset != after[p].offset)
        s.reject(source, "kernel '" + kname + "' parameter " + std::to_string(p) + " was " +
                             std::to_string(before[p].size) + " bytes at offset " +
                             std::to_string(before[p].offset) + ", now " +
                             std::to_string(after[p].size) + " bytes at offset " +
                             std::to_string(after[p].offset));
    staged.limits.push_back(limits_of(*k));
    staged.kernels.push_back(std::move(*k));
  }
  if (const auto why = s.misfit(staged, "the new version"); !why.empty()) s.reject(source, why);
  for (const auto& variable : options.carry_globals) {
    std::optional<device_span<std::byte>> old_bytes, new_bytes;
    try {
      old_bytes.emplace(current.payload().loaded.get_global(variable));
      new_bytes.emplace(staged.loaded.get_global(variable));
    } catch (const error&) {
      s.reject(source, "__device__ variable '" + variable + "' to carry over is missing");
    }
    if (old_bytes->size() != new_bytes->size())
      s.reject(source, "__device__ variable '" + variable + "' to carry over was " +
                           std::to_string(old_bytes->size()) + " bytes, now " +
                           std::to_string(new_bytes->size()));
  }
  if (options.smoke_test) {
    try {
      options.smoke_test(staged.loaded);
    } catch (const std::exception& e) {
      s.reject(source, std::string("smoke test failed: ") + e.what());
    } catch (...) {
      s.reject(source, "smoke test failed");
    }
  }
  version_origin origin{options.bundle_version, options.key_id, source,
                        std::chrono::system_clock::now()};
  return staged_version(std::move(staged), options.carry_globals, source, std::move(origin),
                        s.serial, "module '" + s.name + "' in " + s.ctx.ref().describe());
}

std::uint64_t hot_module::promote(staged_version version) {
  auto& s = checked();
  CUBRIDGE_EXPECTS(version.owner_ != 0,
                   "promoting a moved-from staged_version into module '" + s.name + "'");
  if (version.owner_ != s.serial)
    detail::throw_errc(errc::precondition, "hot_module::promote",
                       "a version staged by " + version.owner_name_ + " cannot be promoted into " +
                           "module '" + s.name + "' in " + s.ctx.ref().describe() +
                           ": its kernels are another module's; stage it with this module, "
                           "which keeps serving");
  state::switching lock(s, !version.carry_globals_.empty());
  const auto id = s.versions.promote(
      std::move(version.version_), std::move(version.origin_),
      [&](const auto& from, const auto& to) {
        // Everything that can fail, before the switch; the staged version is not serving yet.
        if (const auto why = s.misfit(to.payload, "the new version"); !why.empty()) {
          s.rejected.fetch_add(1);
          throw version_rejected_error("hot_module::promote",
                                       "module '" + s.name + "' version from " + version.source_ +
                                           ": " + why + "; the current version keeps serving");
        }
        for (const auto& variable : version.carry_globals_) {
          const auto source = from.payload.loaded.get_global(variable);
          const auto target = to.payload.loaded.get_global(variable);
          CUBRIDGE_CU(cuMemcpy, (target.address(), source.address(), source.size()),
                      "carrying __device__ variable '" + variable + "' of module '" + s.name +
                          "' into the new version");
        }
        s.retarget_all(from.payload, to.payload, to.id);
      });
  for (auto& g : s.graphs) g->bound_version = id;
  s.signal.notify();
  return id;
}

std::uint64_t hot_module::rollback() {
  auto& s = checked();
  state::switching lock(s, false);
  const auto id = s.versions.rollback([&](const auto& from, const auto& to) {
    const std::string who = "version " + std::to_string(to.id);
    if (const auto why = s.misfit(to.payload, who); !why.empty())
      throw version_rejected_error("hot_module::rollback",
                                   "module '" + s.name + "': rollback to " + who +
                                       " refused: " + why + "; version " + std::to_string(from.id) +
                                       " keeps serving");
    s.retarget_all(from.payload, to.payload, to.id);
  });
  for (auto& g : s.graphs) g->bound_version = id;
  s.signal.notify();
  return id;
}

hot_kernel hot_module::get_kernel(std::string_view name) const {
  auto& s = checked();
  for (std::size_t i = 0; i < s.kernel_names.size(); ++i)
    if (s.kernel_names[i] == name) return hot_kernel(state_, i, std::string(name));
  detail::throw_errc(errc::precondition, "hot_module::get_kernel",
                     "module '" + s.name + "' has no kernel '" + std::string(name) + "'");
}

std::uint64_t hot_module::read_global(std::string_view variable, std::span<std::byte> out) const {
  auto& s = checked();
  scoped_current current(s.ctx.ref());
  const auto serving = s.versions.acquire();
  const auto bytes = serving.payload().loaded.get_global(variable);
  const std::string what = "__device__ variable '" + std::string(variable) + "' of module '" +
                           s.name + "' version " + std::to_string(serving.id());
  if (bytes.size() != out.size())
    detail::throw_errc(errc::precondition, "hot_module::read_global",
                       what + " is " + std::to_string(bytes.size()) + " bytes, the destination " +
                           std::to_string(out.size()));
  CUBRIDGE_CU(cuMemcpy, (reinterpret_cast<CUdeviceptr>(out.data()), bytes.address(), out.size()),
              what);
  return serving.id();
}

const std::string& hot_module::name() const {
  return checked().name;
}
context_ref hot_module::context() const {
  return checked().ctx.ref();
}

hot_module_stats hot_module::stats() const {
  auto& s = checked();
  const auto chain_stats = s.versions.get_stats();
  hot_module_stats out;
  out.current_id = chain_stats.current_id;
  out.promotions = chain_stats.promotions;
  out.rejected = s.rejected.load();
  out.retired_waiting = chain_stats.retired;
  out.unloaded = chain_stats.reclaimed;
  out.reclaim_failures = s.reclaim_failures.load();
  std::lock_guard lock(s.failure_mutex);
  out.last_reclaim_failure = s.last_reclaim_failure;
  return out;
}

held_versions hot_module::versions() const {
  return checked().versions.held();
}

std::size_t hot_module::reclaim() const {
  std::size_t unloaded = 0;
  (void)checked().reclaim_now(&unloaded);
  return unloaded;
}

void hot_module::track_graph(CUgraph graph, CUgraphExec exec) {
  auto& s = checked();
  auto tracked = std::make_unique<state::tracked_graph>();
  tracked->graph = graph;
  tracked->exec = exec;
  const std::string what = "tracking a graph of module '" + s.name + "'";
  std::size_t count = 0;
  CUBRIDGE_CU(cuGraphGetNodes, (graph, nullptr, &count), what);
  std::vector<CUgraphNode> nodes(count);
  CUBRIDGE_CU(cuGraphGetNodes, (graph, nodes.data(), &count), what);
  // Under the list's lock: no promote or rollback can switch between reading the nodes and
  // tracking them, so bound_version is the version they launch.
  std::lock_guard lock(s.graphs_mutex);
  const auto current = s.versions.acquire();
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type{};
    CUBRIDGE_CU(cuGraphNodeGetType, (node, &type), what);
    if (type != CU_GRAPH_NODE_TYPE_KERNEL) continue;
    CUDA_KERNEL_NODE_PARAMS params{};
    CUBRIDGE_CU(cuGraphKernelNodeGetParams, (node, &params), what);
    const auto& kernels = current.payload().kernels;
    for (std::size_t i = 0; i < kernels.size(); ++i)
      if (params.func == kernels[i].launch_handle()) tracked->nodes.emplace_back(node, i);
  }
  if (tracked->nodes.empty())
    detail::throw_errc(
        errc::precondition, "hot_module::track_graph",
        "no kernel node of the graph launches the current version of module '" + s.name + "'");
  tracked->bound_version = current.id();
  s.graphs.push_back(std::move(tracked));
}

void hot_module::untrack_graph(CUgraphExec exec) {
  auto& s = checked();
  std::lock_guard lock(s.graphs_mutex);
  std::erase_if(s.graphs, [&](const auto& g) { return g->exec == exec; });
}

namespace {
[[noreturn]] void refuse_per_thread_stream(const std::string& what) {
  detail::throw_errc(errc::precondition, "hot launch",
                     what +
                         " on the per-thread default stream (CU_STREAM_PER_THREAD): it is "
                         "another stream on every thread, so the event that lets its "
                         "version be unloaded could not follow this thread's work. Launch on "
                         "a stream of your own (cubridge::stream) or the legacy default stream");
}
}  // namespace

std::uint64_t hot_module::launch_graph(CUgraphExec exec, stream_ref stream) const {
  auto& s = checked();
  if (stream.is_per_thread()) [[unlikely]]
    refuse_per_thread_stream("a graph of module '" + s.name + "'");
  state::tracked_graph* g = nullptr;
  {
    std::lock_guard lock(s.graphs_mutex);
    for (auto& candidate : s.graphs)
      if (candidate->exec == exec) g = candidate.get();
  }
  CUBRIDGE_EXPECTS(g != nullptr, "launch_graph of a graph that module '" + s.name +
                                     "' does not track (track_graph first)");
  std::lock_guard lock(g->mutex);
  const auto lease = s.versions.acquire();
  s.retarget(*g, lease.payload(), lease.id());  // a failed undo may have left it unknown
  CUBRIDGE_CU(cuGraphLaunch, (exec, stream.get()),
              "a graph of module '" + s.name + "' on version " + std::to_string(lease.id()));
  lease.note(stream.get());
  return lease.id();
}

CUgraphNode hot_kernel::add_node(CUgraph graph, const kernel& k, const launch_config& c,
                                 void** arguments) const {
  CUDA_KERNEL_NODE_PARAMS params{};
  params.func = k.launch_handle();
  detail::set_launch_shape(params, c);
  params.kernelParams = arguments;
  CUgraphNode node = nullptr;
  CUBRIDGE_CU(cuGraphAddKernelNode, (&node, graph, nullptr, 0, &params),
              "kernel node of '" + name_ + "' in module '" + state_->name + "'");
  note_usage(c);
  return node;
}

hot_kernel::chain::lease hot_kernel::acquire() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from hot_kernel");
  return state_->versions.acquire();
}

hot_kernel::chain::lease hot_kernel::acquire(const launch_config& config) const {
  if (config.stream.is_per_thread()) [[unlikely]]
    refuse_per_thread_stream("hot kernel '" + name_ + "' of module '" +
                             (state_ ? state_->name : std::string("?")) + "' launched");
  return acquire();
}

void hot_kernel::finish(const chain::lease& lease, const launch_config& config) const {
  // A serving thread launches the same version on the same stream again and again; noting the
  // stream once is enough (the note holds until the version is unpinned and retired, after which
  // no lease on it exists), so repeats skip the version's mutex.
  // A destroyed stream's handle may come back for a new stream: the generation tells.
  thread_local std::uint64_t noted_serial = 0;
  thread_local CUstream noted_stream = nullptr;
  thread_local std::uint64_t noted_generation = 0;
  const CUstream stream = config.stream.get();
  const auto generation = detail::stream_generation();
  if (noted_serial != lease.serial() || noted_stream != stream || noted_generation != generation) {
    lease.note(stream);
    noted_serial = lease.serial();
    noted_stream = stream;
    noted_generation = generation;
  }
  note_usage(config);
}

void hot_kernel::note_usage(const launch_config& config) const noexcept {
  auto& usage = state_->usage[index_];
  raise_to(usage.threads_per_block, config.block.volume());
  raise_to(usage.dynamic_shared_bytes, config.dynamic_shared_bytes);
}

}  // namespace cubridge
