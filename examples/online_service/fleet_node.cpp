// online_service as a fleet node; see fleet_node.hpp.
#include "fleet_node.hpp"

#include <cubridge/fleet/subjects.hpp>

#include <algorithm>

#include <stdexcept>

#if ONLINE_SERVICE_FLEET
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/connection.hpp>
#endif

namespace online_service {

bool fleet_supported() noexcept {
  return ONLINE_SERVICE_FLEET != 0;
}

std::string shown_servers(const fleet_node_options& options) {
#if ONLINE_SERVICE_FLEET
  return cubridge::fleet::redact_server_list(options.server);
#else
  return std::count(options.server.begin(), options.server.end(), '@') ? "(a URL with credentials)"
                                                                       : options.server;
#endif
}

std::string check_fleet_node_options(const fleet_node_options& options) {
  if (options.server.empty()) return "--fleet-server is empty";
  if (options.node_key.empty()) return "--node-key is needed: the node signs what it reports";
  if (options.heartbeat_interval.count() <= 0) return "the heartbeat interval must be positive";
  return cubridge::fleet::check_fleet_name(options.node, "--node");
}

#if ONLINE_SERVICE_FLEET

struct fleet_node::impl {
  fleet_node_options options;
  cubridge::fleet_agent agent;

  static cubridge::fleet_agent_options agent_options(const fleet_node_options& o) {
    cubridge::fleet_agent_options a;
    a.bus.servers = o.server;
    a.bus.credentials = o.credentials;
    a.bus.ca_file = o.ca;
    a.node = o.node;
    a.node_key_file = o.node_key;
    a.heartbeat_interval = o.heartbeat_interval;
    if (o.health)
      a.health_probe = [health = o.health](std::string_view, std::uint64_t) {
        const auto h = health();
        return cubridge::health_report{h.healthy, h.values, h.detail};
      };
    return a;
  }
  impl(std::shared_ptr<cubridge::update_gate> gate, fleet_node_options o)
      : options(std::move(o)), agent(std::move(gate), agent_options(options)) {}
};

fleet_node::fleet_node(std::shared_ptr<cubridge::update_gate> gate, fleet_node_options options)
    : impl_(std::make_unique<impl>(std::move(gate), std::move(options))) {}

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
  nlohmann::json out{{"node", impl_->options.node},    {"server", agent.connected_server()},
                     {"connected", agent.connected()}, {"converged", agent.converged()},
                     {"applied", stats.applied},       {"refused", stats.refused},
                     {"retries", stats.retries},       {"last_result", nullptr},
                     {"problem", agent.last_problem()}};
  if (const auto last = agent.last_result())
    out["last_result"] = nlohmann::json::parse(cubridge::fleet::to_json(*last), nullptr, false);
  return out;
}

#else  // built without libnats: the options parse, nothing starts

struct fleet_node::impl {
  fleet_node_options options;
};

fleet_node::fleet_node(std::shared_ptr<cubridge::update_gate>, fleet_node_options options)
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
