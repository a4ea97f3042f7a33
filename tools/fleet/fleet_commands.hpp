#pragma once
// `cubridge fleet publish | status | rollback | watch`: the control side of a fleet rollout over
// NATS JetStream (docs/fleet.md, "The control side").
#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cubridge::tool {

/// Registers `fleet` and its four subcommands on `app`; run() runs whichever was parsed.
class fleet_commands {
 public:
  explicit fleet_commands(CLI::App& app);
  fleet_commands(const fleet_commands&) = delete;
  fleet_commands& operator=(const fleet_commands&) = delete;

  /// True when the command line named `fleet`.
  [[nodiscard]] bool parsed() const;
  /// Runs what was parsed and returns the exit status (tools/exit_codes.hpp): exit_ok;
  /// exit_failure (a bad input file, a halted rollout, a node that did not apply, a server that
  /// refused); exit_usage (a command line wrong in a way CLI11 could not see);
  /// exit_unreachable (no NATS server at --server, or the connection lost). Reports every
  /// error in one line on stderr. Never throws.
  [[nodiscard]] int run() const noexcept;

 private:
  CLI::App* fleet_;
  CLI::App* publish_;
  CLI::App* status_;
  CLI::App* rollback_;
  CLI::App* watch_;
  std::string server_ = "nats://127.0.0.1:4222";
  struct {
    std::string file, key, name, target;
    std::uint64_t version = 0;
    std::size_t canary = 0, successes = 0;
    double window_s = 60;
    std::vector<std::string> nodes;
    bool wait = false;
    bool allow_readable_key = false;
  } publish_args_;
  bool status_json_ = false;
  struct {
    std::string module, key;
    std::uint64_t from_version = 0;
    bool allow_readable_key = false;
  } rollback_args_;
  bool watch_once_ = false;

  int publish() const;
  int status() const;
  int rollback() const;
  int watch() const;
};

}  // namespace cubridge::tool
