#pragma once
// A module_sink in memory for the CLI and fleet tests (update_test_server, test_cli,
// test_fleet_agent, test_fleet_rollout, test_update_gate): per module the serving version and one
// to roll back to, as hot_module keeps them; counts its applies and can refuse one version; no
// GPU.
#include <cubridge/update/module_sink.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cubridge::testing {

class memory_sink final : public cubridge::module_sink {
 public:
  explicit memory_sink(cubridge::compute_capability device = {9, 0}) : device_(device) {}
  std::optional<cubridge::compute_capability> device_capability() const override { return device_; }
  std::uint64_t current_version(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    return it == modules_.end() ? 0 : it->second.first;
  }
  cubridge::sink_result apply(const cubridge::verified_bundle& bundle,
                              cubridge::apply_rule rule) override {
    ++applies;
    std::lock_guard lock(mutex_);
    if (bundle.version() == fail_version) {  // as a failed smoke test would: nothing changes
      const auto it = modules_.find(bundle.manifest.name);
      const auto reason = fail_reason.load();
      return {reason, it == modules_.end() ? 0 : it->second.first,
              reason == cubridge::gate_reason::apply_failed ? "smoke test failed"
                                                            : "refused in its probation"};
    }
    auto& [current, previous] = modules_[bundle.manifest.name];
    if (rule == cubridge::apply_rule::above_serving && bundle.version() <= current)
      return cubridge::not_newer_result(bundle.manifest.name, bundle.version(), current);
    previous = current;
    current = bundle.version();
    payloads_[bundle.manifest.name] = bundle.payload;
    return {cubridge::gate_reason::none, current, {}};
  }
  cubridge::sink_result rollback(std::string_view name) override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    if (it == modules_.end()) return {cubridge::gate_reason::unknown_module, 0, "no such module"};
    auto& [current, previous] = it->second;
    if (previous == 0) return {cubridge::gate_reason::no_previous_version, current, "none"};
    std::swap(current, previous);
    return {cubridge::gate_reason::none, current, {}};
  }
  std::vector<cubridge::module_report> status() const override {
    std::lock_guard lock(mutex_);
    std::vector<cubridge::module_report> out;
    for (const auto& [name, v] : modules_)
      out.push_back({name, v.first, {v.second, v.first}, 0, {}});
    return out;
  }
  /// Calls of apply(), whatever their outcome.
  std::atomic<int> applies{0};
  /// A version apply() refuses (0: none), as a failed smoke test would, and the reason it
  /// answers (a probation's, e.g. faulted_in_probation).
  std::atomic<std::uint64_t> fail_version{0};
  std::atomic<cubridge::gate_reason> fail_reason{cubridge::gate_reason::apply_failed};

  /// The payload last applied to `name` (empty when none).
  std::vector<std::byte> payload(const std::string& name) const {
    std::lock_guard lock(mutex_);
    const auto it = payloads_.find(name);
    return it == payloads_.end() ? std::vector<std::byte>{} : it->second;
  }

 private:
  cubridge::compute_capability device_;
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> modules_;
  std::map<std::string, std::vector<std::byte>> payloads_;
};

}  // namespace cubridge::testing
