#pragma once
// A fleet node inside bench_fleet's own process, for fleets that do not fit as processes on the
// bench machine (1,000 nodes): a fleet_agent over its own update_gate (its own replay state
// file, written and fsync'd as a node process's is) over its own recording sink, with its own
// Ed25519 key file (mode 0600) and bus credentials. As tests/fleet/fleet_node.cpp's node, the
// sink records the version and never loads the payload; it keeps it in memory (no file).
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_gate.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

namespace cubridge::bench {

/// A sink that records the version of one module and loads nothing.
class memory_sink final : public module_sink {
 public:
  explicit memory_sink(std::string module) : module_(std::move(module)) {}
  std::optional<compute_capability> device_capability() const override {
    return compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view name) const override;
  sink_result apply(const verified_bundle& bundle, apply_rule rule) override;
  sink_result rollback(std::string_view name) override;
  std::vector<module_report> status() const override;

 private:
  const std::string module_;
  mutable std::mutex mutex_;
  std::uint64_t current_ = 0, previous_ = 0;
};

/// One in-process node. Not copyable or movable (the agent points into it).
class in_process_node {
 public:
  /// Node `id` following `module`, trusting `operator_key`, its files under `dir`, reaching
  /// the bus at `servers` as the user of `credentials`, over TLS verified with `ca_file` when
  /// one is given.
  in_process_node(std::string id, const std::filesystem::path& dir, const std::string& module,
                  const cubridge::public_key& operator_key, const std::string& servers,
                  const std::filesystem::path& credentials,
                  const std::filesystem::path& ca_file = {});
  in_process_node(const in_process_node&) = delete;
  in_process_node& operator=(const in_process_node&) = delete;
  ~in_process_node();

  [[nodiscard]] const std::string& id() const noexcept { return id_; }
  [[nodiscard]] const cubridge::public_key& public_key() const noexcept { return public_key_; }
  /// Starts the agent (it connects by itself).
  void start();
  /// Stops the agent. Never throws.
  void stop() noexcept;
  [[nodiscard]] bool connected() const noexcept { return agent_ && agent_->connected(); }
  [[nodiscard]] std::uint64_t serving() const;
  [[nodiscard]] fleet_agent_stats stats() const noexcept;
  [[nodiscard]] std::string last_problem() const;

 private:
  std::string id_, module_;
  std::shared_ptr<memory_sink> sink_;
  cubridge::public_key public_key_;
  std::shared_ptr<update_gate> gate_;
  std::unique_ptr<fleet_agent> agent_;
};

}  // namespace cubridge::bench
