#pragma once
// One fleet node process (tests/fleet/fleet_node.cpp) for the process tests and bench/fleet:
// started with its event lines in a file, which the test reads to wait on conditions (a line seen)
// with a deadline, never a fixed sleep. Killed (SIGKILL) when the object goes.
#include "temp_dir.hpp"

#include "eventually.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/child_process.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace cubridge::testing {

/// Polls `done` every 10 ms for up to `deadline`: a condition, never a fixed sleep.

class fleet_node_process {
 public:
  /// A node `id` whose files (state, event lines, its own key) live under `dir`.
  fleet_node_process(std::string id, const std::filesystem::path& dir)
      : id_(std::move(id)),
        state_file_(dir / (id_ + ".state")),
        output_(dir / (id_ + ".out")),
        key_file_(dir / (id_ + ".key")) {
    auto keys = generate_keypair();
    public_key_ = keys.public_key;
    write_key_file(key_file_, keys.secret_key);
  }

  [[nodiscard]] const std::string& id() const noexcept { return id_; }
  /// The public half of the node's key, to enrol it.
  [[nodiscard]] const cubridge::public_key& public_key() const noexcept { return public_key_; }

  /// Starts the node (again: its event lines go on in the same file, after a "start" line).
  void start(const std::string& server_url, const std::filesystem::path& key_file,
             const std::string& module, const std::vector<std::string>& extra = {}) {
    { std::ofstream(output_, std::ios::app) << "start\n"; }
    detail::child_spec spec;
    spec.program = CUBRIDGE_FLEET_NODE;
    spec.args = {"--server",      server_url,           "--node",         id_,
                 "--trusted-key", key_file.string(),    "--node-key",     key_file_.string(),
                 "--state-file",  state_file_.string(), "--module",       module,
                 "--output",      output_.string(),     "--heartbeat-ms", "1000"};
    spec.args.insert(spec.args.end(), extra.begin(), extra.end());
    spec.environment = detail::current_environment();
    process_ = detail::child_process::spawn(spec);
  }

  /// Every event line since the last start.
  [[nodiscard]] std::vector<std::string> lines() const {
    std::ifstream in(output_);
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) {
      if (line == "start")
        all.clear();
      else
        all.push_back(line);
    }
    return all;
  }
  /// Whether a line since the last start begins with `prefix`.
  [[nodiscard]] bool has_line(const std::string& prefix) const {
    for (const auto& line : lines())
      if (line.rfind(prefix, 0) == 0) return true;
    return false;
  }
  /// Lines since the last start beginning with `prefix`.
  [[nodiscard]] std::size_t count_lines(const std::string& prefix) const {
    std::size_t n = 0;
    for (const auto& line : lines()) n += line.rfind(prefix, 0) == 0 ? 1U : 0U;
    return n;
  }
  /// Waits for a line beginning with `prefix`; false when the node exits or time runs out.
  bool wait_line(const std::string& prefix,
                 std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
    return eventually([&] { return has_line(prefix) || !alive(); }, deadline) && has_line(prefix);
  }
  [[nodiscard]] bool alive() {
    if (!process_.running()) return false;
    if (auto ended = process_.try_wait()) {
      exit_ = ended->describe();
      return false;
    }
    return true;
  }
  /// How the node ended, when it did.
  [[nodiscard]] const std::string& exit_text() const noexcept { return exit_; }
  /// The versions the sink serves now (serving, previous), from its file.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> serving() const {
    std::ifstream in(state_file_.string() + ".serving");
    std::uint64_t current = 0, previous = 0;
    in >> current >> previous;
    return {current, previous};
  }
  /// SIGTERM and wait (10 s, then SIGKILL).
  void stop() {
    if (!process_.running()) return;
    ::kill(process_.pid(), SIGTERM);
    if (const auto ended = process_.wait_for(std::chrono::seconds(10)))
      exit_ = ended->describe();
    else
      (void)process_.kill();
  }
  /// SIGKILL, as a crash.
  void kill() { (void)process_.kill(); }

 private:
  std::string id_;
  std::filesystem::path state_file_;
  std::filesystem::path output_;
  std::filesystem::path key_file_;
  cubridge::public_key public_key_;
  detail::child_process process_;
  std::string exit_;
};

}  // namespace cubridge::testing
