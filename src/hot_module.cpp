#include <cubridge/detail/check.hpp>
#include <cubridge/detail/stream_listeners.hpp>
#include <cubridge/driver.hpp>
#include <cubridge/hot_module.hpp>
#include <cubridge/image.hpp>
#include <cubridge/scoped_current.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
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

std::vector<std::string> interface_of(std::span<const std::byte> image, const std::string& name) {
  const auto info = inspect_image(image);
  std::vector<std::string> names;
  for (const auto& k : info.kernels) names.push_back(k.name);
  if (names.empty())
    detail::throw_errc(errc::precondition, "hot_module::load",
                       "module '" + name + "': the first version exports no kernel that the "
                       "image inspector can see (a fatbin whose entries are all compressed?)");
  return names;
}

}  // namespace

struct hot_module::state {
  state(context_arg c, std::string n, std::vector<std::string> names, hot_version first)
      : ctx(std::move(c)),
        name(std::move(n)),
        kernel_names(std::move(names)),
        usage(kernel_names.size()),
        versions(std::move(first)),
        stream_listener(detail::add_stream_listener([this](CUstream s) { seal(s); })),
        reclaimer([this] { reclaim_loop(); }) {}

  state(const state&) = delete;
  state& operator=(const state&) = delete;

  ~state() {
    detail::remove_stream_listener(stream_listener);
    {
      std::lock_guard lock(reclaimer_mutex);
      stopping = true;
    }
    wake.notify_all();
    reclaimer.join();
  }

  /// Unloads what can be unloaded; never throws (a broken context is reported by launches).
  std::size_t reclaim_now() noexcept {
    try {
      scoped_current current(ctx.ref());
      return versions.reclaim(
          [](const event& e) {
            // Done, or failed for good (a sticky fault): either way nothing more will run.
            return driver::api().cuEventQuery(e.get()) != CUDA_ERROR_NOT_READY;
          },
          [this](const CUstream& s) { return last_event_on(s); });
    } catch (...) {
      return 0;
    }
  }

  /// An event recorded on `s` now: complete once everything queued on `s` so far is.
  event last_event_on(CUstream s) {
    auto e = event::create(ctx);
    // If the driver refuses (a raw stream destroyed without before_stream_destroy()), its queued
    // work still runs to the end: wait for the whole context, on this (non-serving) thread, and
    // return the never-recorded event, which queries as complete. Failing would pin the version.
    if (driver::api().cuEventRecord(e.get(), s) != CUDA_SUCCESS)
      (void)driver::api().cuCtxSynchronize();
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
      // Out of events or a broken context: the version then stays pinned, which is safe.
    }
  }

  void reclaim_loop() {
    std::unique_lock lock(reclaimer_mutex);
    while (!stopping) {
      // Sleep until a promotion retires something; then poll briefly until it is unloaded.
      if (versions.get_stats().retired == 0)
        wake.wait(lock);
      else
        wake.wait_for(lock, std::chrono::milliseconds(1));
      if (stopping) break;
      lock.unlock();
      (void)reclaim_now();
      lock.lock();
    }
  }

  [[noreturn]] void reject(const std::string& source, const std::string& cause) {
    rejected.fetch_add(1);
    detail::throw_errc(errc::version_rejected, "hot_module::stage",
                       "module '" + name + "' version from " + source + ": " + cause +
                           "; the current version keeps serving");
  }

  /// An instantiated graph that follows the current version.
  struct tracked_graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    std::vector<std::pair<CUgraphNode, std::size_t>> nodes;  // node, interface kernel index
    std::uint64_t bound_version = 0;                         // the version its nodes launch
    std::mutex mutex;  // a graph exec is not thread-safe: retarget and launch one at a time
  };

  /// Points `g`'s nodes at `to`'s kernels, if they point elsewhere. Caller holds g.mutex.
  void retarget(tracked_graph& g, const hot_kernel::chain::lease& to) {
    if (g.bound_version == to.id()) return;
    for (const auto& [node, index] : g.nodes) {
      CUDA_KERNEL_NODE_PARAMS params{};
      const std::string what = "kernel node of '" + kernel_names[index] + "' in a graph of module '" +
                               name + "', retargeted to version " + std::to_string(to.id());
      CUBRIDGE_CU(cuGraphKernelNodeGetParams, (node, &params), what);
      params.func = to.payload().kernels[index].launch_handle();
      params.kern = nullptr;
      params.ctx = nullptr;
      CUBRIDGE_CU(cuGraphKernelNodeSetParams, (node, &params), what);
      CUBRIDGE_CU(cuGraphExecKernelNodeSetParams, (g.exec, node, &params), what);
    }
    g.bound_version = to.id();
  }

  /// Retargets every tracked graph to the current version (after promote and rollback).
  void retarget_all() {
    std::lock_guard list_lock(graphs_mutex);
    if (graphs.empty()) return;
    scoped_current current(ctx.ref());
    const auto to = versions.acquire();
    for (auto& g : graphs) {
      std::lock_guard lock(g->mutex);
      retarget(*g, to);
    }
  }

  context_arg ctx;
  std::string name;
  std::vector<std::string> kernel_names;
  std::vector<launch_usage> usage;  // per kernel, same order as kernel_names
  hot_kernel::chain versions;
  std::atomic<std::uint64_t> rejected{0};
  std::mutex graphs_mutex;
  std::vector<std::unique_ptr<tracked_graph>> graphs;

  std::uint64_t stream_listener;  // removed first in ~state, before anything it uses dies

  std::mutex reclaimer_mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread reclaimer;  // last: starts once everything above exists
};

hot_module hot_module::load(context_arg ctx, std::string name, std::span<const std::byte> image) {
  auto names = interface_of(image, name);
  auto loaded = module::load(ctx, image, {.name = name + " v1"});
  hot_version first{std::move(loaded), {}};
  for (const auto& k : names) first.kernels.push_back(first.loaded.get_kernel(k));
  return hot_module(
      std::make_shared<state>(std::move(ctx), std::move(name), std::move(names), std::move(first)));
}

hot_module::~hot_module() = default;

staged_version hot_module::stage(std::span<const std::byte> image,
                                 const stage_options& options) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  auto& s = *state_;
  const std::string source = options.source_name.empty() ? "memory" : options.source_name;
  std::optional<module> loaded;
  try {
    loaded.emplace(module::load(s.ctx, image, {.name = s.name + " (staged from " + source + ")"}));
  } catch (const image_error&) {
    s.rejected.fetch_add(1);
    throw;
  }
  // The interface: the same kernels with the same parameters, fitting the launches in use.
  const auto current = s.versions.acquire();
  hot_version staged{std::move(*loaded), {}};
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
    const auto threads = s.usage[i].threads_per_block.load();
    const auto max_threads =
        static_cast<unsigned long long>(k->attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
    if (threads > max_threads)
      s.reject(source, "kernel '" + kname + "' is launched with " + std::to_string(threads) +
                           " threads per block, the new version allows " +
                           std::to_string(max_threads));
    const auto shared = s.usage[i].dynamic_shared_bytes.load();
    const auto max_shared =
        static_cast<unsigned>(k->attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES));
    if (shared > max_shared)
      s.reject(source, "kernel '" + kname + "' is launched with " + std::to_string(shared) +
                           " bytes of dynamic shared memory, the new version allows " +
                           std::to_string(max_shared));
    staged.kernels.push_back(std::move(*k));
  }
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
  return staged_version(std::move(staged), options.carry_globals);
}

std::uint64_t hot_module::promote(staged_version version) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  if (!version.carry_globals_.empty()) {
    scoped_current current(state_->ctx.ref());
    const auto serving = state_->versions.acquire();
    for (const auto& variable : version.carry_globals_) {
      const auto from = serving.payload().loaded.get_global(variable);
      const auto to = version.version_.loaded.get_global(variable);
      CUBRIDGE_CU(cuMemcpy, (to.address(), from.address(), from.size()),
                  "carrying __device__ variable '" + variable + "' of module '" + state_->name +
                      "' into the new version");
    }
  }
  const auto id = state_->versions.promote(std::move(version.version_));
  state_->wake.notify_all();
  state_->retarget_all();
  return id;
}

std::uint64_t hot_module::rollback() {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  const auto id = state_->versions.rollback();
  state_->wake.notify_all();
  state_->retarget_all();
  return id;
}

hot_kernel hot_module::get_kernel(std::string_view name) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  for (std::size_t i = 0; i < state_->kernel_names.size(); ++i)
    if (state_->kernel_names[i] == name) return hot_kernel(state_, i, std::string(name));
  detail::throw_errc(errc::precondition, "hot_module::get_kernel",
                     "module '" + state_->name + "' has no kernel '" + std::string(name) + "'");
}

std::uint64_t hot_module::read_global(std::string_view variable, std::span<std::byte> out) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  scoped_current current(state_->ctx.ref());
  const auto serving = state_->versions.acquire();
  const auto bytes = serving.payload().loaded.get_global(variable);
  const std::string what = "__device__ variable '" + std::string(variable) + "' of module '" +
                           state_->name + "' version " + std::to_string(serving.id());
  if (bytes.size() != out.size())
    detail::throw_errc(errc::precondition, "hot_module::read_global",
                       what + " is " + std::to_string(bytes.size()) + " bytes, the destination " +
                           std::to_string(out.size()));
  CUBRIDGE_CU(cuMemcpy, (reinterpret_cast<CUdeviceptr>(out.data()), bytes.address(), out.size()), what);
  return serving.id();
}

const std::string& hot_module::name() const noexcept { return state_->name; }
context_ref hot_module::context() const noexcept { return state_->ctx.ref(); }

hot_module_stats hot_module::stats() const {
  const auto chain_stats = state_->versions.get_stats();
  return {chain_stats.current_id, chain_stats.promotions, state_->rejected.load(),
          chain_stats.retired, chain_stats.reclaimed};
}

std::size_t hot_module::reclaim() const {
  return state_->reclaim_now();
}

void hot_module::track_graph(CUgraph graph, CUgraphExec exec) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  auto& s = *state_;
  auto tracked = std::make_unique<state::tracked_graph>();
  tracked->graph = graph;
  tracked->exec = exec;
  const std::string what = "tracking a graph of module '" + s.name + "'";
  std::size_t count = 0;
  CUBRIDGE_CU(cuGraphGetNodes, (graph, nullptr, &count), what);
  std::vector<CUgraphNode> nodes(count);
  CUBRIDGE_CU(cuGraphGetNodes, (graph, nodes.data(), &count), what);
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
    detail::throw_errc(errc::precondition, "hot_module::track_graph",
                       "no kernel node of the graph launches the current version of module '" +
                           s.name + "'");
  tracked->bound_version = current.id();
  std::lock_guard lock(s.graphs_mutex);
  s.graphs.push_back(std::move(tracked));
}

void hot_module::untrack_graph(CUgraphExec exec) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  std::lock_guard lock(state_->graphs_mutex);
  std::erase_if(state_->graphs, [&](const auto& g) { return g->exec == exec; });
}

std::uint64_t hot_module::launch_graph(CUgraphExec exec, stream_ref stream) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "hot_module was moved from");
  auto& s = *state_;
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
  s.retarget(*g, lease);  // a promote may not have reached this graph yet
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

hot_kernel::chain::lease hot_kernel::acquire() const { return state_->versions.acquire(); }

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
