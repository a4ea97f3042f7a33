#pragma once
// `cubridge fleet publish | status | rollback | watch | enroll | init`: the control side of the
// fleet's control plane over NATS JetStream (docs/fleet.md, "The control side").
#include "fleet/fleet_init.hpp"

#include <CLI/CLI.hpp>
#include <cubridge/fleet/controller.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cubridge::fleet {
struct controller_options;
}

namespace cubridge::tool {

/// Registers `fleet` and its subcommands on `app` (`init`: fleet_init.hpp); run() runs whichever
/// was parsed.
class fleet_commands {
 public:
  explicit fleet_commands(CLI::App& app);
  fleet_commands(const fleet_commands&) = delete;
  fleet_commands& operator=(const fleet_commands&) = delete;

  /// True when the command line named `fleet`.
  [[nodiscard]] bool parsed() const;
  /// Runs what was parsed and returns the exit status (tools/exit_codes.hpp): exit_ok;
  /// exit_failure (a bad input file, a halted rollout, a node that did not apply, a server that
  /// refused, a conflict with another writer); exit_usage (a command line wrong in a way CLI11
  /// could not see: a bad server URL, a window that is not a positive number); exit_unreachable
  /// (no NATS server at --server, or the connection lost). Reports every error in one line on
  /// stderr, never a credential. Never throws.
  [[nodiscard]] int run() const noexcept;

 private:
  CLI::App* fleet_ = nullptr;
  CLI::App* publish_ = nullptr;
  CLI::App* status_ = nullptr;
  CLI::App* rollback_ = nullptr;
  CLI::App* resume_ = nullptr;
  CLI::App* abort_ = nullptr;
  CLI::App* watch_ = nullptr;
  CLI::App* dashboard_ = nullptr;
  std::string dashboard_listen_ = "127.0.0.1:8090";
  CLI::App* enroll_ = nullptr;
  CLI::App* init_ = nullptr;
  fleet_init_options init_options_;
  // What the command line or the environment gave (empty or 0: not given); a profile fills
  // the rest, then the defaults (fleet::bus_options).
  struct {
    std::string server, credentials, ca, profile;
    int replicas = 0;
    std::vector<std::string> trusted_keys;
  } bus_;
  struct {
    std::string file, key, name, target, cohort;
    std::uint64_t version = 0;
    std::size_t canary = 0, successes = 0;
    double window_s = 60, publish_timeout_s = 0;
    std::vector<std::string> waves, max_metrics;
    double bake_s = 30, wave_deadline_s = 600, max_failure_rate = -1;
    std::string baseline_breach = "halt";
    std::uint32_t max_missed_heartbeats = 3;
    bool wait = false;
    bool allow_readable_key = false;
  } publish_args_;
  bool status_json_ = false;
  std::string status_key_;
  struct {
    std::string module, key;
    std::uint64_t to_version = 0;
    bool allow_readable_key = false;
  } rollback_args_;
  bool watch_once_ = false;
  struct {
    std::string node, node_key, key;
    std::vector<std::string> labels;
    bool allow_readable_key = false;
  } enroll_args_;

  [[nodiscard]] fleet::controller_options options(const std::string& signing_key,
                                                  bool allow_readable_key) const;
  int publish() const;
  int status() const;
  int rollback() const;
  int resume_or_abort(bool resume) const;
  /// Prints a wave rollout's timeline and ending; its exit status.
  int wave_outcome(const fleet::rollout_report& report) const;
  int watch() const;
  // The subcommands' options, by group (the constructor's parts).
  void bus_options(CLI::App* command);
  void add_publish();
  void add_state_commands();
  void add_views();
  void add_enroll();
  int dashboard() const;
  int enroll() const;
};

}  // namespace cubridge::tool
