#pragma once
// online_service's logs: whole lines on stdout (line_log), the log of module changes
// (logged_sink), the line that says the process was poisoned (poison_logging), and the CSV of
// requests (request_log).
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/update/module_sink.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace online_service {

using wall_clock = std::chrono::system_clock;

inline double unix_seconds(wall_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// The first line of a (possibly multi-line) message, for one-line logs.
inline std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end) + " ...";
}

// Whole lines on stdout from any thread, each stamped with the time since start.
class line_log {
 public:
  line_log() : start_(wall_clock::now()) {}
  [[nodiscard]] wall_clock::time_point start() const { return start_; }
  [[nodiscard]] double seconds_since_start() const {
    return std::chrono::duration<double>(wall_clock::now() - start_).count();
  }
  void line(const std::string& text) {
    std::lock_guard lock(mutex_);
    std::printf("t=+%.3fs %s\n", seconds_since_start(), text.c_str());
    std::fflush(stdout);
  }

 private:
  wall_clock::time_point start_;
  std::mutex mutex_;
};

// A sink in front of the hot_module_sink, one per way updates arrive ("pushed" for the update
// endpoint, "fleet" for the fleet agent): every promotion, rollback and refused stage is logged
// in one line naming that way (refusals and rollbacks name only the fleet, so that the endpoint's
// lines read as they always did). The endpoint and the agent each serialise their own calls, but
// not each other's: `serial_` does. It holds the inner sink (the gate holds it in turn); `log`
// is the service's, which outlives its gate.
class logged_sink final : public cubridge::module_sink {
 public:
  logged_sink(std::shared_ptr<cubridge::module_sink> inner, line_log& log, std::string how)
      : inner_(std::move(inner)),
        log_(log),
        how_(std::move(how)),
        note_(how_ == "pushed" ? "" : ", " + how_) {}

  [[nodiscard]] std::optional<cubridge::compute_capability> device_capability() const override {
    return inner_->device_capability();
  }
  [[nodiscard]] std::uint64_t current_version(std::string_view name) const override {
    return inner_->current_version(name);
  }
  [[nodiscard]] std::vector<cubridge::module_report> status() const override {
    return inner_->status();
  }

  cubridge::sink_result apply(const cubridge::verified_bundle& bundle,
                              cubridge::apply_rule rule) override {
    std::lock_guard lock(serial_);
    const auto& m = bundle.manifest;
    const auto before = inner_->current_version(m.name);
    auto result = inner_->apply(bundle, rule);
    if (result.reason == cubridge::gate_reason::none)
      log_.line("module " + m.name + ": version " + std::to_string(before) + " -> " +
                std::to_string(result.serving_version) + " (" + how_ + ", key " +
                cubridge::to_hex(m.key_id) + ")");
    else
      log_.line("module " + m.name + ": version " + std::to_string(m.version) + " refused (" +
                std::string(cubridge::to_string(result.reason)) + note_ + "), version " +
                std::to_string(before) + " keeps serving: " + first_line(result.detail));
    return result;
  }

  cubridge::sink_result rollback(std::string_view name) override {
    std::lock_guard lock(serial_);
    const auto before = inner_->current_version(name);
    auto result = inner_->rollback(name);
    if (result.reason == cubridge::gate_reason::none)
      log_.line("module " + std::string(name) + ": version " + std::to_string(before) + " -> " +
                std::to_string(result.serving_version) + " (rolled back" + note_ + ")");
    return result;
  }

 private:
  std::shared_ptr<cubridge::module_sink> inner_;
  line_log& log_;
  std::string how_;
  std::string note_;
  std::mutex serial_;  // one apply or rollback at a time, whatever the module or the door
};

// One line when the process is poisoned, for as long as this lives (scripts/demo --bad-versions
// measures from its unix time):
//   t=+5.210s online_service: poisoned at unix 1796113747.254132: poisoned by
//   CUDA_ERROR_ILLEGAL_ADDRESS seen by cuStreamQuery at ...; serving: kernels v3 (id 2) ...
// The listener holds the log: it may run on another thread while this is destroyed.
class poison_logging {
 public:
  explicit poison_logging(std::shared_ptr<line_log> log)
      : id_(cubridge::add_poison_listener([log](const cubridge::poison_record& r) {
          try {
            char at[64];
            std::snprintf(at, sizeof at,
                          "online_service: poisoned at unix %.6f: ", unix_seconds(r.at));
            log->line(at + cubridge::describe(r));
          } catch (...) {
            // No memory for the line: /readyz still says it.
          }
        })) {}
  poison_logging(const poison_logging&) = delete;
  poison_logging& operator=(const poison_logging&) = delete;
  ~poison_logging() { cubridge::remove_poison_listener(id_); }

 private:
  std::uint64_t id_;
};

// Writes one CSV line per request: unix_time,version,latency_us,ok.
class request_log {
 public:
  explicit request_log(const std::string& path) {
    if (path.empty()) return;
    file_.open(path, std::ios::trunc);
    if (!file_) throw std::runtime_error("cannot write the request log " + path);
    file_ << "unix_time,version,latency_us,ok\n";
  }
  void add(wall_clock::time_point start, unsigned version, double latency_us, bool ok) {
    if (!file_.is_open()) return;
    char line[96];
    std::snprintf(line, sizeof line, "%.6f,%u,%.1f,%d\n", unix_seconds(start), version, latency_us,
                  ok ? 1 : 0);
    std::lock_guard lock(mutex_);
    file_ << line;
  }

 private:
  std::mutex mutex_;
  std::ofstream file_;
};

}  // namespace online_service
