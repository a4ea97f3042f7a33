#pragma once
// What the control side believes of each node's heartbeats (docs/fleet.md, "Liveness and
// evidence"): every verified heartbeat in the order the server stored it, each with the time the
// server received it. A pure decision, cut out of the I/O (the controller feeds it from the
// heartbeat stream), so that its rules are tested without a server:
//
// - A heartbeat that goes back is refused: the same run (boot id) with a sequence number not
//   above the last one taken, or a run that an earlier heartbeat already replaced. An older
//   signed heartbeat written back (an open or misconfigured bus) so changes nothing.
// - Another run is a restart when it started no earlier than the run it replaces (the node's
//   clock, whole seconds), or when that run has been silent for 3 of its intervals (a node
//   whose clock went back across a restart is not locked out).
// - Liveness and silence are measured from the server's receive time, never from the node's
//   clock: a node whose clock runs hours ahead is not live after it dies, nor one behind dead.

#include <cubridge/fleet/records.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>

namespace cubridge::fleet {

/// What the ledger made of one heartbeat.
enum class heartbeat_verdict {
  taken,        ///< the newest of its run
  restarted,    ///< the first of a new run: the node restarted (taken)
  replayed,     ///< its run's sequence went back or stood still (refused)
  earlier_run,  ///< of a run a later one replaced, or started before the current one (refused)
};
/// "taken", "restarted", "replayed", "earlier_run".
[[nodiscard]] std::string_view to_string(heartbeat_verdict verdict) noexcept;

/// The most runs per node whose ids the ledger keeps to refuse them.
inline constexpr std::size_t max_retired_runs = 16;

/// How far a node's own clock may be from the server's before the node is said to be skewed.
inline constexpr std::chrono::seconds clock_skew_warning{30};

class heartbeat_ledger {
 public:
  using time_point = std::chrono::system_clock::time_point;

  /// A node as its heartbeats taken show it.
  struct entry {
    heartbeat beat{};       ///< the last one taken
    time_point received{};  ///< when the server received it
    /// Restarts seen since the ledger first heard of the node.
    std::uint64_t restarts = 0;
    /// Heartbeats refused as going back.
    std::uint64_t refused = 0;
    /// Runs replaced, newest last.
    std::deque<std::string> retired{};
  };

  /// Takes `beat`, verified as node `beat.node`'s, received by the server at `received`, in the
  /// order the server stored it.
  heartbeat_verdict take(const heartbeat& beat, time_point received);
  /// The node's entry; null when none of its heartbeats was taken.
  [[nodiscard]] const entry* find(std::string_view node) const;

  /// Whether a node last heard from at `received` at `interval` is live at `now`: heard within 3
  /// intervals and a second (heartbeat times and the two clocks are a second apart at most).
  [[nodiscard]] static bool live(time_point received, std::chrono::milliseconds interval,
                                 time_point now) noexcept;

 private:
  std::map<std::string, entry, std::less<>> nodes_;
};

}  // namespace cubridge::fleet
