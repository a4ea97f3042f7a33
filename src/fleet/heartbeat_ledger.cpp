// The control side's ledger of heartbeats (heartbeat_ledger.hpp).
#include <cubridge/fleet/heartbeat_ledger.hpp>

#include <algorithm>

namespace cubridge::fleet {

std::string_view to_string(heartbeat_verdict verdict) noexcept {
  switch (verdict) {
    case heartbeat_verdict::taken:
      return "taken";
    case heartbeat_verdict::restarted:
      return "restarted";
    case heartbeat_verdict::replayed:
      return "replayed";
    case heartbeat_verdict::earlier_run:
      return "earlier_run";
  }
  return "unknown";
}

bool heartbeat_ledger::live(time_point received, std::chrono::milliseconds interval,
                            time_point now) noexcept {
  return now - received < 3 * interval + std::chrono::seconds(1);
}

heartbeat_verdict heartbeat_ledger::take(const heartbeat& beat, time_point received) {
  const auto [it, first] = nodes_.try_emplace(beat.node);
  auto& e = it->second;
  const auto keep = [&](heartbeat_verdict verdict) {
    e.beat = beat;
    e.received = received;
    return verdict;
  };
  if (first) return keep(heartbeat_verdict::taken);
  const auto refuse = [&](heartbeat_verdict verdict) {
    ++e.refused;
    return verdict;
  };
  // A node that predates boot ids: the stream's order is all there is.
  if (beat.boot.empty() && e.beat.boot.empty()) return keep(heartbeat_verdict::taken);
  if (!beat.boot.empty() &&
      std::find(e.retired.begin(), e.retired.end(), beat.boot) != e.retired.end())
    return refuse(heartbeat_verdict::earlier_run);
  if (beat.boot == e.beat.boot)
    return beat.sequence > e.beat.sequence ? keep(heartbeat_verdict::taken)
                                           : refuse(heartbeat_verdict::replayed);
  // Another run: a restart if it is not older than the current one, or the current one died.
  const bool silent = !live(e.received, e.beat.interval, received);
  if (!beat.boot.empty() && !e.beat.boot.empty() && beat.started < e.beat.started && !silent)
    return refuse(heartbeat_verdict::earlier_run);
  if (beat.boot.empty() && !silent) return refuse(heartbeat_verdict::earlier_run);
  if (!e.beat.boot.empty()) {
    e.retired.push_back(e.beat.boot);
    if (e.retired.size() > max_retired_runs) e.retired.pop_front();
  }
  ++e.restarts;
  return keep(heartbeat_verdict::restarted);
}

const heartbeat_ledger::entry* heartbeat_ledger::find(std::string_view node) const {
  const auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : &it->second;
}

}  // namespace cubridge::fleet
