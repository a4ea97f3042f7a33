// `cubridge fleet status [--json]` and `cubridge fleet watch [--once]`.
#include "fleet/fleet_status.hpp"

#include "exit_codes.hpp"
#include "fleet/fleet_commands.hpp"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace cubridge::tool {
namespace {

using json = nlohmann::json;

// Per module the node runs and the fleet wants for everyone: desired minus current.
std::map<std::string, std::int64_t> lags(const fleet::node_state& node,
                                         const std::vector<fleet::module_state>& modules) {
  std::map<std::string, std::int64_t> out;
  for (const auto& m : modules) {
    if (!m.desired_all) continue;
    const auto it = node.beat.versions.find(m.module);
    const std::uint64_t current = it == node.beat.versions.end() ? 0 : it->second;
    out[m.module] = static_cast<std::int64_t>(*m.desired_all - current);
  }
  return out;
}

json result_json(const fleet::result_record& r) {
  return {{"module", r.module}, {"version", r.version}, {"outcome", to_string(r.outcome)},
          {"reason", r.reason}, {"detail", r.detail},   {"serving_version", r.serving_version}};
}

std::string result_text(const fleet::result_record& r) {
  return r.module + " v" + std::to_string(r.version) + " " + std::string(to_string(r.outcome)) +
         (r.reason.empty() ? "" : " " + r.reason);
}

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) {
  interrupted = true;
}

}  // namespace

json fleet_status_json(const std::vector<fleet::node_state>& nodes,
                       const std::vector<fleet::module_state>& modules) {
  json out{{"nodes", json::array()}, {"modules", json::array()}};
  for (const auto& n : nodes) {
    json node{{"node", n.beat.node},
              {"cohort", n.beat.cohort},
              {"gpu", n.beat.gpu},
              {"live", n.live},
              {"age_s", n.age.count()},
              {"versions", n.beat.versions},
              {"lag", lags(n, modules)},
              {"last_result", n.beat.last_result ? result_json(*n.beat.last_result) : json()}};
    out["nodes"].push_back(std::move(node));
  }
  for (const auto& m : modules) {
    json module{{"module", m.module},
                {"desired_all", m.desired_all ? json(*m.desired_all) : json()},
                {"desired_canary", m.desired_canary ? json(*m.desired_canary) : json()},
                {"halted", m.halted_reason.empty()
                               ? json()
                               : json{{"version", m.halted_version}, {"reason", m.halted_reason}}}};
    out["modules"].push_back(std::move(module));
  }
  return out;
}

std::string render_fleet_status(const std::vector<fleet::node_state>& nodes,
                                const std::vector<fleet::module_state>& modules) {
  std::ostringstream out;
  out << std::left << std::setw(20) << "NODE" << std::setw(6) << "LIVE" << std::setw(8) << "AGE"
      << std::setw(28) << "VERSIONS" << std::setw(12) << "LAG"
      << "LAST RESULT\n";
  for (const auto& n : nodes) {
    std::string versions, lag;
    for (const auto& [module, version] : n.beat.versions)
      versions += (versions.empty() ? "" : " ") + module + " v" + std::to_string(version);
    for (const auto& [module, behind] : lags(n, modules))
      lag += (lag.empty() ? "" : " ") + std::to_string(behind);
    out << std::setw(20) << n.beat.node << std::setw(6) << (n.live ? "yes" : "NO") << std::setw(8)
        << (std::to_string(n.age.count()) + "s") << std::setw(28)
        << (versions.empty() ? "-" : versions) << std::setw(12) << (lag.empty() ? "-" : lag)
        << (n.beat.last_result ? result_text(*n.beat.last_result) : "-") << "\n";
  }
  if (nodes.empty()) out << "(no node has sent a heartbeat)\n";
  for (const auto& m : modules) {
    out << "module " << m.module << ": desired all "
        << (m.desired_all ? "v" + std::to_string(*m.desired_all) : "-") << ", canary "
        << (m.desired_canary ? "v" + std::to_string(*m.desired_canary) : "-");
    if (!m.halted_reason.empty())  // escaped by the controller
      out << "; rollout of v" << m.halted_version << " HALTED: " << m.halted_reason;
    out << "\n";
  }
  return out.str();
}

int fleet_commands::status() const {
  fleet::controller control({server_});
  const auto nodes = control.nodes();
  const auto modules = control.modules();
  if (status_json_)
    std::cout << fleet_status_json(nodes, modules).dump(2) << "\n";
  else
    std::cout << render_fleet_status(nodes, modules);
  return exit_ok;
}

int fleet_commands::watch() const {
  fleet::controller control({server_});
  if (watch_once_) {
    std::cout << render_fleet_status(control.nodes(), control.modules());
    return exit_ok;
  }
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  while (!interrupted) {
    if (terminal) std::cout << "\x1b[H\x1b[2J";  // redrawn in place
    std::cout << render_fleet_status(control.nodes(), control.modules()) << std::flush;
    if (!terminal) std::cout << "\n";
    for (int i = 0; i < 10 && !interrupted; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return exit_ok;
}

}  // namespace cubridge::tool
