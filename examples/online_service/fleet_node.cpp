// online_service as a fleet node; see fleet_node.hpp.
#include "fleet_node.hpp"

#include <cubridge/fleet/subjects.hpp>

#include <stdexcept>

#if ONLINE_SERVICE_FLEET
#include <cubridge/fleet/agent.hpp>
#endif

namespace online_service {

bool fleet_supported() noexcept {
  return ONLINE_SERVICE_FLEET != 0;
}

std::string check_fleet_node_options(const fleet_node_options& options) {
  if (options.server.empty()) return "--fleet-server is empty";
  if (options.heartbeat_interval.count() <= 0) return "the heartbeat interval must be positive";
  return cubridge::fleet::check_fleet_name(options.node, "--node");
}

#if ONLINE_SERVICE_FLEET

struct fleet_node::impl {
  fleet_node_options options;
  cubridge::fleet_agent agent;

  static cubridge::fleet_agent_options agent_options(const cubridge::trusted_keys& keys,
                                                     const fleet_node_options& o) {
    cubridge::fleet_agent_options a;
    a.servers = o.server;
    a.node = o.node;
    a.gate.keys = keys;  // trusted exactly as the endpoint trusts
    a.heartbeat_interval = o.heartbeat_interval;
    return a;
  }
  impl(cubridge::module_sink& sink, const cubridge::trusted_keys& keys, fleet_node_options o)
      : options(std::move(o)), agent(sink, agent_options(keys, options)) {}
};

fleet_node::fleet_node(cubridge::module_sink& sink, const cubridge::trusted_keys& keys,
                       fleet_node_options options)
    : impl_(std::make_unique<impl>(sink, keys, std::move(options))) {}

fleet_node::~fleet_node() {
  stop();
}

void fleet_node::start() {
  impl_->agent.start();
}

void fleet_node::stop() noexcept {
  impl_->agent.stop();
}

nlohmann::json fleet_node::status() const {
  const auto& agent = impl_->agent;
  const auto stats = agent.stats();
  nlohmann::json out{{"node", impl_->options.node},    {"server", impl_->options.server},
                     {"connected", agent.connected()}, {"applied", stats.applied},
                     {"refused", stats.refused},       {"rolled_back", stats.rolled_back},
                     {"last_result", nullptr}};
  if (const auto last = agent.last_result())
    out["last_result"] = nlohmann::json::parse(cubridge::fleet::to_json(*last), nullptr, false);
  return out;
}

#else  // built without libnats: the options parse, nothing starts

struct fleet_node::impl {
  fleet_node_options options;
};

fleet_node::fleet_node(cubridge::module_sink&, const cubridge::trusted_keys&,
                       fleet_node_options options)
    : impl_(std::make_unique<impl>(impl{std::move(options)})) {}

fleet_node::~fleet_node() = default;

void fleet_node::start() {
  throw std::runtime_error(
      "online_service was built without libnats (no cubridge_fleet): it "
      "cannot be fleet node " +
      impl_->options.node);
}

void fleet_node::stop() noexcept {}

nlohmann::json fleet_node::status() const {
  return {{"node", impl_->options.node}, {"server", impl_->options.server}, {"connected", false}};
}

#endif

}  // namespace online_service
