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

// Per module the node follows: what its desired state names for it minus what it serves.
std::map<std::string, std::int64_t> lags(const fleet::node_state& node,
                                         const std::vector<fleet::desired_entry>& modules) {
  std::map<std::string, std::int64_t> out;
  if (!node.beat) return out;
  for (const auto& m : modules) {
    const auto it = node.beat->versions.find(m.state.module);
    if (it == node.beat->versions.end()) continue;
    const auto* target = m.state.target_for(node.node);
    if (!target) continue;
    out[m.state.module] =
        static_cast<std::int64_t>(target->version) - static_cast<std::int64_t>(it->second);
  }
  return out;
}

json ref_json(const std::optional<fleet::bundle_ref>& r) {
  if (!r) return nullptr;
  return {{"version", r->version}, {"digest", r->digest}, {"size", r->size}, {"target", r->target}};
}

json result_json(const fleet::result_record& r) {
  return {{"module", r.module},
          {"revision", r.revision},
          {"version", r.version},
          {"outcome", to_string(r.outcome)},
          {"reason", r.reason},
          {"detail", r.detail},
          {"serving_version", r.serving_version}};
}

std::string result_text(const fleet::result_record& r) {
  return r.module + " v" + std::to_string(r.version) + " " + std::string(to_string(r.outcome)) +
         (r.reason.empty() ? "" : " " + r.reason);
}

std::string version_text(const std::optional<fleet::bundle_ref>& r) {
  return r ? "v" + std::to_string(r->version) : "-";
}

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) {
  interrupted = true;
}

}  // namespace

fleet_reading read_fleet(const fleet::controller& control) {
  fleet_reading r;
  r.nodes = control.nodes(std::chrono::system_clock::now(), &r.report);
  r.modules = control.modules(&r.report);
  r.warnings = control.warnings();
  r.open_bus = control.open_bus();
  return r;
}

json fleet_status_json(const fleet_reading& reading) {
  json out{{"nodes", json::array()},
           {"modules", json::array()},
           {"refused", reading.report.refused},
           {"complete", reading.report.complete},
           {"warnings", reading.warnings},
           {"open_bus", reading.open_bus}};
  for (const auto& n : reading.nodes) {
    const auto& b = n.beat;
    out["nodes"].push_back(
        {{"node", n.node},
         {"labels", n.labels},
         {"cohort", b ? json(b->cohort) : json()},
         {"gpu", b ? json(b->gpu) : json()},
         {"software", b ? json(b->software) : json()},
         {"live", n.live},
         {"age_s", n.age.count()},
         {"versions", b ? json(b->versions) : json::object()},
         {"lag", lags(n, reading.modules)},
         {"last_result", b && b->last_result ? result_json(*b->last_result) : json()},
         {"run", b ? json(b->boot) : json()},
         {"restarts", n.restarts},
         {"replayed", n.replayed},
         {"clock_skew_s", n.clock_skew.count()},
         {"node_problem", b ? json(b->problem) : json()},
         {"problem", n.problem}});
  }
  for (const auto& m : reading.modules) {
    const auto& s = m.state;
    out["modules"].push_back({{"module", s.module},
                              {"revision", s.revision},
                              {"phase", to_string(s.phase)},
                              {"stable", ref_json(s.stable)},
                              {"candidate", ref_json(s.candidate)},
                              {"canaries", s.canaries},
                              {"reason", s.reason},
                              {"time", s.time},
                              {"software", s.software}});
  }
  return out;
}

std::string render_fleet_status(const fleet_reading& reading) {
  std::ostringstream out;
  if (reading.open_bus)
    out << "WARNING: this bus takes clients without credentials: a laptop demo only "
           "(docs/fleet.md, Running it)\n";
  for (const auto& w : reading.warnings) out << "warning: " << w << "\n";
  out << std::left << std::setw(20) << "NODE" << std::setw(6) << "LIVE" << std::setw(8) << "AGE"
      << std::setw(28) << "VERSIONS" << std::setw(12) << "LAG"
      << "LAST RESULT\n";
  for (const auto& n : reading.nodes) {
    std::string versions, lag;
    if (n.beat)
      for (const auto& [module, version] : n.beat->versions)
        versions += (versions.empty() ? "" : " ") + module + " v" + std::to_string(version);
    for (const auto& [module, behind] : lags(n, reading.modules))
      lag += (lag.empty() ? "" : " ") + std::to_string(behind);
    out << std::setw(20) << n.node << std::setw(6) << (n.live ? "yes" : "NO") << std::setw(8)
        << (n.beat ? std::to_string(n.age.count()) + "s" : "-") << std::setw(28)
        << (versions.empty() ? "-" : versions) << std::setw(12) << (lag.empty() ? "-" : lag)
        << (n.beat && n.beat->last_result ? result_text(*n.beat->last_result)
                                          : (n.problem.empty() ? "-" : n.problem))
        << "\n";
  }
  if (reading.nodes.empty()) out << "(no node is enrolled: cubridge fleet enroll)\n";
  for (const auto& n : reading.nodes) {
    if (n.beat && std::chrono::abs(n.clock_skew) > fleet::clock_skew_warning)
      out << "warning: node " << n.node << "'s clock is " << n.clock_skew.count()
          << " s off the server's (liveness uses the server's receive time)\n";
    if (n.replayed > 0)
      out << "warning: node " << n.node << ": " << n.replayed
          << " heartbeat(s) going back were refused (an older one written again?)\n";
    if (n.beat && !n.beat->problem.empty())
      out << "node " << n.node << "'s last problem: " << n.beat->problem << "\n";
  }
  for (const auto& m : reading.modules) {
    const auto& s = m.state;
    out << "module " << s.module << ": " << to_string(s.phase) << ", stable "
        << version_text(s.stable);
    if (s.phase == fleet::rollout_phase::canary) {
      out << ", candidate " << version_text(s.candidate) << " on";
      for (const auto& c : s.canaries) out << " " << c;
    }
    out << " (revision " << s.revision << ")";
    if (!s.reason.empty())
      out << "; " << (s.phase == fleet::rollout_phase::halted ? "HALTED: " : "") << s.reason;
    out << "\n";
  }
  for (const auto& [reason, count] : reading.report.refused)
    out << "refused: " << count << " x " << reason << "\n";
  if (!reading.report.complete) out << "(not everything was read within the read deadline)\n";
  return out.str();
}

int fleet_commands::status() const {
  fleet::controller control(options(status_key_, true));
  const auto reading = read_fleet(control);
  if (status_json_)
    std::cout << fleet_status_json(reading).dump(2) << "\n";
  else
    std::cout << render_fleet_status(reading);
  return exit_ok;
}

int fleet_commands::watch() const {
  const auto o = options(status_key_, true);
  auto control = std::make_unique<fleet::controller>(o);
  if (watch_once_) {
    std::cout << render_fleet_status(read_fleet(*control));
    return exit_ok;
  }
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  std::string last;  // the last table shown, kept on screen while the server is away
  while (!interrupted) {
    std::string table;
    try {
      if (!control) {
        control = std::make_unique<fleet::controller>(o);
        std::cerr << "cubridge: fleet watch: connected again to " << control->connected_server()
                  << "\n";
      }
      table = last = render_fleet_status(read_fleet(*control));
    } catch (const error& e) {
      if (!e.is(fleet_errc::unreachable)) throw;
      // A server restart: say so, keep the last table, and connect again.
      if (control)
        std::cerr << "cubridge: fleet watch: lost the server (" << fleet::redact_url(e.what())
                  << "): connecting again\n";
      control.reset();
      table = last + "(not connected to the server: connecting again)\n";
    }
    if (terminal) std::cout << "\x1b[H\x1b[2J";  // redrawn in place
    std::cout << table << std::flush;
    if (!terminal) std::cout << "\n";
    for (int i = 0; i < 10 && !interrupted; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return exit_ok;
}

}  // namespace cubridge::tool
