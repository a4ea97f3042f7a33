#pragma once
// Prometheus text exposition format, version 0.0.4 (what GET /metrics answers): a writer of
// metric families, each a "# HELP" and a "# TYPE" line and its samples, with label values
// escaped as the format says. Written by hand: the format is a few rules, no dependency needed.
//
//   cubridge::metrics_text_writer out;
//   out.family("cubridge_module_version", "The bundle version serving.", metric_type::gauge);
//   out.sample(7, {{"module", "filters"}});
//   std::string body = std::move(out).str();  // served as metrics_text_content_type
//
// Used by the update endpoint (update_endpoint_options::serve_metrics) and the fleet agent
// (fleet_agent::metrics_text()); write_module_metrics() writes what a module_sink reports,
// write_process_health_metrics() whether the process is poisoned.

#include <cubridge/update/module_sink.hpp>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cubridge {

/// The Content-Type of the text format 0.0.4.
inline constexpr std::string_view metrics_text_content_type = "text/plain; version=0.0.4";

/// A family's TYPE.
enum class metric_type { counter, gauge };

/// One label of a sample; the value is escaped by the writer.
struct metric_label {
  std::string_view name{};
  std::string_view value{};
};

/// Whether `name` is a metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
[[nodiscard]] bool is_metric_name(std::string_view name) noexcept;
/// Whether `name` is a label name: [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved).
[[nodiscard]] bool is_label_name(std::string_view name) noexcept;
/// A label value as the format writes it between the quotes: '\' as "\\", '"' as "\"", a line
/// feed as "\n"; every other byte as it is.
[[nodiscard]] std::string escape_label_value(std::string_view value);
/// HELP text as the format writes it: '\' as "\\", a line feed as "\n".
[[nodiscard]] std::string escape_help(std::string_view help);

/// Writes families one after the other. Not thread-safe (one writer per answer).
class metrics_text_writer {
 public:
  /// Starts the family `name`: its HELP and TYPE lines. Its samples follow, before the next
  /// family. @throws error (errc::precondition) for a name that is no metric name or a family
  /// written already.
  void family(std::string_view name, std::string_view help, metric_type type);
  /// A sample of the current family, with `labels` in the order given.
  /// @throws error (errc::precondition) before any family, for a label name that is no label
  ///         name, or one given twice.
  void sample(std::uint64_t value, std::initializer_list<metric_label> labels = {});
  /// The text so far; every line ends in a line feed.
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  /// The text, moved out.
  [[nodiscard]] std::string str() && noexcept { return std::move(text_); }

 private:
  std::string text_;
  std::string current_;  // the current family's name
  std::vector<std::string> families_;
};

/// Per module of `reports` (module_sink::status()): cubridge_module_version,
/// cubridge_module_versions_held, cubridge_module_retired_waiting, and for modules that report
/// counters (module_report::counters, a hot module's) cubridge_module_promotions_total,
/// cubridge_module_rollbacks_total, cubridge_module_rejected_total,
/// cubridge_module_unloaded_total, cubridge_module_reclaim_failures_total; each labelled
/// {module="<name>"}. A fixed number of lines per module. @throws as the writer.
void write_module_metrics(metrics_text_writer& out, const std::vector<module_report>& reports);

/// Whether the process is poisoned (core/process_health.hpp), as a gauge that flips:
/// cubridge_process_poisoned (0 or 1), and while `poisoned_since` is set,
/// cubridge_process_poisoned_since_seconds (when the sticky error was seen, unix seconds). Two
/// lines more when poisoned, none with a label. @throws as the writer.
void write_process_health_metrics(
    metrics_text_writer& out, bool poisoned,
    std::optional<std::chrono::system_clock::time_point> poisoned_since);

}  // namespace cubridge
