// Tracked CUDA graphs of a hot module: their kernel nodes follow the current version (retargeted
// on promote and rollback, all or nothing), and launch_graph() keeps the version it ran loaded.
// Nodes come from hot_kernel::capture() (remembered per capture until the graph is tracked) or
// from the graph's kernel nodes that launch the serving version.
#include "hot_module_state.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <algorithm>
#include <mutex>

namespace cubridge {

void hot_module::state::set_node_function(tracked_graph& g, CUgraphNode node, std::size_t index,
                                          CUfunction function, std::uint64_t to_id, int& steps) {
  const auto what = [&] {
    return "kernel node of '" + kernel_names[index] + "' in " + graph_name(g) + " of module '" +
           name + "', retargeted to version " + std::to_string(to_id);
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

bool hot_module::state::restore_node_function(tracked_graph& g, CUgraphNode node,
                                              CUfunction function, int steps) noexcept {
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

void hot_module::state::retarget(tracked_graph& g, const hot_version& to, std::uint64_t to_id) {
  if (g.bound_version == to_id) return;
  scoped_current in_context(ctx.ref());
  for (const auto& [node, index] : g.nodes) {
    int steps = 0;
    set_node_function(g, node, index, to.kernels[index].launch_handle(), to_id, steps);
  }
  g.bound_version = to_id;
}

void hot_module::state::retarget_all(const hot_version& from, const hot_version& to,
                                     std::uint64_t to_id) {
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

void hot_module::state::run_inner(const std::function<void()>& inner, const hot_version& from) {
  if (!inner) return;
  try {
    inner();
  } catch (...) {
    // retarget_all pointed every graph at the new version (bound_version still names `from`'s,
    // set only once the switch is made): point them back, or mark them for launch_graph().
    for (auto& g : graphs)
      for (const auto& [node, index] : g->nodes)
        if (!restore_node_function(*g, node, from.kernels[index].launch_handle(), 2))
          g->bound_version = 0;
    throw;
  }
}

void hot_module::track_graph(CUgraph graph, CUgraphExec exec, std::string graph_name) {
  auto& s = checked();
  auto tracked = std::make_unique<state::tracked_graph>();
  tracked->graph = graph;
  tracked->exec = exec;
  tracked->name = std::move(graph_name);
  const std::string what =
      "tracking " + state::graph_name(*tracked) + " of module '" + s.name + "'";
  std::size_t count = 0;
  CUBRIDGE_CU(cuGraphGetNodes, (graph, nullptr, &count), what);
  std::vector<CUgraphNode> nodes(count);
  CUBRIDGE_CU(cuGraphGetNodes, (graph, nodes.data(), &count), what);
  // The nodes hot_kernel::capture() added: known by handle, whatever version they launch (a
  // promote may have come since, and unloaded it).
  for (const auto& c : s.take_captured(graph))
    if (std::find(nodes.begin(), nodes.end(), c.node) != nodes.end())
      tracked->nodes.emplace_back(c.node, c.index);
  const bool had_captured = !tracked->nodes.empty();
  // Under the list's lock: no promote or rollback can switch between reading the nodes and
  // tracking them, so bound_version is the version the scanned nodes launch.
  std::lock_guard lock(s.graphs_mutex);
  const auto current = s.versions.acquire();
  const auto& kernels = current.payload().kernels;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type{};
    CUBRIDGE_CU(cuGraphNodeGetType, (node, &type), what);
    if (type != CU_GRAPH_NODE_TYPE_KERNEL) continue;
    if (std::any_of(tracked->nodes.begin(), tracked->nodes.end(),
                    [&](const auto& n) { return n.first == node; }))
      continue;
    CUDA_KERNEL_NODE_PARAMS params{};
    CUBRIDGE_CU(cuGraphKernelNodeGetParams, (node, &params), what);
    for (std::size_t i = 0; i < kernels.size(); ++i)
      if (params.func == kernels[i].launch_handle()) tracked->nodes.emplace_back(node, i);
  }
  if (tracked->nodes.empty())
    detail::throw_errc(errc::precondition, "hot_module::track_graph",
                       "no kernel node of " + state::graph_name(*tracked) + " launches module '" +
                           s.name +
                           "' (neither captured by hot_kernel::capture nor launching the "
                           "serving version)");
  // Captured nodes may launch an older version: point every node at the serving one now,
  // before the graph's first launch. Scanned nodes launch it already.
  if (had_captured) s.retarget(*tracked, current.payload(), current.id());
  tracked->bound_version = current.id();
  s.graphs.push_back(std::move(tracked));
}

std::vector<followed_graph> hot_module::graphs() const {
  auto& s = checked();
  std::lock_guard lock(s.graphs_mutex);
  std::vector<followed_graph> out;
  out.reserve(s.graphs.size());
  for (const auto& g : s.graphs)
    out.push_back({g->name, g->exec, g->bound_version, g->nodes.size()});
  return out;
}

void hot_module::state::note_captured(CUstream stream, std::size_t index,
                                      const std::string& kernel_name) {
  CUstreamCaptureStatus status{};
  std::uint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* dependencies = nullptr;
  std::size_t count = 0;
  CUBRIDGE_CU(
      cuStreamGetCaptureInfo, (stream, &status, &id, &graph, &dependencies, nullptr, &count),
      "the node a capture of hot kernel '" + kernel_name + "' of module '" + name + "' added");
  // The launch just captured is the stream's only dependency now: the next node follows it.
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || count != 1)
    detail::throw_errc(errc::precondition, "hot_kernel::capture",
                       "the capture of hot kernel '" + kernel_name + "' of module '" + name +
                           "' left no single node to follow (the capture was invalidated, or "
                           "another thread added to it meanwhile)");
  std::lock_guard lock(captured_mutex);
  // A graph handle seen with another capture id was destroyed and reused: its old nodes are gone.
  std::erase_if(captured,
                [&](const captured_node& c) { return c.graph == graph && c.capture_id != id; });
  if (captured.size() >= max_captured_nodes) captured.erase(captured.begin());
  captured.push_back({graph, id, dependencies[0], index});
}

std::vector<hot_module::state::captured_node> hot_module::state::take_captured(CUgraph graph) {
  std::lock_guard lock(captured_mutex);
  std::vector<captured_node> out;
  std::erase_if(captured, [&](const captured_node& c) {
    if (c.graph != graph) return false;
    out.push_back(c);
    return true;
  });
  return out;
}

std::string hot_module::state::graph_name(const tracked_graph& g) {
  return g.name.empty() ? std::string("a graph") : "graph '" + g.name + "'";
}

void hot_kernel::expect_capturing(const launch_config& config) const {
  CUstreamCaptureStatus status{};
  CUBRIDGE_CU(cuStreamIsCapturing, (config.stream.get(), &status),
              "hot kernel '" + name_ + "' of module '" + state_->name + "' captured");
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    detail::throw_errc(
        errc::precondition, "hot_kernel::capture",
        "hot kernel '" + name_ + "' of module '" + state_->name +
            "' captured on a stream that is not capturing (" +
            (status == CU_STREAM_CAPTURE_STATUS_NONE ? "no capture" : "capture invalidated") +
            "): use launch()");
}

void hot_kernel::captured(const chain::lease& lease, const launch_config& config) const {
  count_launch(lease, config);
  state_->note_captured(config.stream.get(), index_, name_);
}

void hot_module::untrack_graph(CUgraphExec exec) {
  auto& s = checked();
  std::lock_guard lock(s.graphs_mutex);
  std::erase_if(s.graphs, [&](const auto& g) { return g->exec == exec; });
}

std::uint64_t hot_module::launch_graph(CUgraphExec exec, stream_ref stream) const {
  return launch_graph(exec, stream, [&] {
    CUBRIDGE_CU(cuGraphLaunch, (exec, stream.get()),
                "a graph of module '" + state_->name + "' launched");
  });
}

std::uint64_t hot_module::launch_graph(CUgraphExec exec, stream_ref stream,
                                       const std::function<void()>& launch) const {
  auto& s = checked();
  if (stream.is_per_thread()) [[unlikely]]
    hot_module_internal::refuse_per_thread_stream("a graph of module '" + s.name + "'");
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
  launch();
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

}  // namespace cubridge
