// The Prometheus text format 0.0.4 writer (metrics_text.hpp), the families of what a
// module_sink reports and the process's health gauge.
#include <cubridge/core/error.hpp>
#include <cubridge/update/metrics_text.hpp>

#include <algorithm>
#include <charconv>

namespace cubridge {
namespace {

bool is_name_start(char c, bool colon) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
bool is_name_char(char c, bool colon) noexcept {
  return is_name_start(c, colon) || (c >= '0' && c <= '9');
}
bool is_name(std::string_view name, bool colon) noexcept {
  if (name.empty() || !is_name_start(name.front(), colon)) return false;
  return std::all_of(name.begin(), name.end(), [&](char c) { return is_name_char(c, colon); });
}

// `text` with '\' and line feeds escaped, and '"' too where `quote`.
std::string escaped(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

}  // namespace

bool is_metric_name(std::string_view name) noexcept {
  return is_name(name, true);
}

bool is_label_name(std::string_view name) noexcept {
  return is_name(name, false) && !name.starts_with("__");
}

std::string escape_label_value(std::string_view value) {
  return escaped(value, true);
}

std::string escape_help(std::string_view help) {
  return escaped(help, false);
}

void metrics_text_writer::family(std::string_view name, std::string_view help, metric_type type) {
  CUBRIDGE_EXPECTS(is_metric_name(name), "metric family name '" + escape_label_value(name) +
                                             "' ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  CUBRIDGE_EXPECTS(std::find(families_.begin(), families_.end(), name) == families_.end(),
                   "metric family '" + std::string(name) + "' written twice");
  families_.emplace_back(name);
  current_ = name;
  text_.append("# HELP ").append(name).append(" ").append(escape_help(help)).append("\n");
  text_.append("# TYPE ").append(name).append(type == metric_type::counter ? " counter\n"
                                                                           : " gauge\n");
}

void metrics_text_writer::sample(std::uint64_t value, std::initializer_list<metric_label> labels) {
  CUBRIDGE_EXPECTS(!current_.empty(), "a metric sample before any family");
  for (auto l = labels.begin(); l != labels.end(); ++l) {
    CUBRIDGE_EXPECTS(is_label_name(l->name), "label name '" + escape_label_value(l->name) +
                                                 "' of metric '" + current_ +
                                                 "' ([a-zA-Z_][a-zA-Z0-9_]*, not __...)");
    CUBRIDGE_EXPECTS(
        std::none_of(labels.begin(), l,
                     [&](const metric_label& earlier) { return earlier.name == l->name; }),
        "label '" + std::string(l->name) + "' given twice to metric '" + current_ + "'");
  }
  text_ += current_;
  if (labels.size() != 0) {
    text_ += '{';
    const char* separator = "";
    for (const auto& l : labels) {
      text_.append(separator).append(l.name).append("=\"");
      text_.append(escape_label_value(l.value)).append("\"");
      separator = ",";
    }
    text_ += '}';
  }
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, value).ptr;
  text_.append(" ").append(digits, end).append("\n");
}

void write_module_metrics(metrics_text_writer& out, const std::vector<module_report>& reports) {
  using counted = std::uint64_t module_counters::*;
  struct gauge_family {
    const char* name;
    const char* help;
    std::uint64_t (*value)(const module_report&);
  };
  static constexpr gauge_family gauges[] = {
      {"cubridge_module_version", "The bundle version serving, per module (0: none).",
       [](const module_report& r) { return r.current_version; }},
      {"cubridge_module_versions_held",
       "Versions a rollback could use: the rollback target and the serving one.",
       [](const module_report& r) { return static_cast<std::uint64_t>(r.versions_held.size()); }},
      {"cubridge_module_retired_waiting",
       "Retired versions not yet unloaded: pinned by launches or GPU work in flight.",
       [](const module_report& r) { return r.in_flight; }},
  };
  for (const auto& g : gauges) {
    out.family(g.name, g.help, metric_type::gauge);
    for (const auto& r : reports) out.sample(g.value(r), {{"module", r.name}});
  }
  struct counter_family {
    const char* name;
    const char* help;
    counted member;
  };
  static constexpr counter_family counters[] = {
      {"cubridge_module_promotions_total",
       "Switches to another version (promotions, rollbacks included).",
       &module_counters::promotions},
      {"cubridge_module_rollbacks_total", "Rollbacks done.", &module_counters::rollbacks},
      {"cubridge_module_rejected_total", "Versions refused while staging or promoting.",
       &module_counters::rejected},
      {"cubridge_module_unloaded_total", "Retired versions unloaded.", &module_counters::unloaded},
      {"cubridge_module_reclaim_failures_total",
       "Failures on the way to unloading a retired version (retried).",
       &module_counters::reclaim_failures},
  };
  const bool any = std::any_of(reports.begin(), reports.end(),
                               [](const module_report& r) { return r.counters.has_value(); });
  if (!any) return;
  for (const auto& c : counters) {
    out.family(c.name, c.help, metric_type::counter);
    for (const auto& r : reports)
      if (r.counters) out.sample((*r.counters).*c.member, {{"module", r.name}});
  }
  // Per version: the serving version's launches start at 0 when it is promoted, so a rate over
  // them (Grafana's, a rollout's) is that version's.
  static constexpr counter_family launches[] = {
      {"cubridge_module_launches_total", "Hot launches of the serving version.",
       &module_counters::launches},
      {"cubridge_module_launch_failures_total",
       "Hot launches of the serving version the driver refused.",
       &module_counters::launch_failures},
  };
  for (const auto& c : launches) {
    out.family(c.name, c.help, metric_type::counter);
    for (const auto& r : reports)
      if (r.counters)
        out.sample((*r.counters).*c.member,
                   {{"module", r.name}, {"version", std::to_string(r.current_version)}});
  }
}

void write_process_health_metrics(
    metrics_text_writer& out, bool poisoned,
    std::optional<std::chrono::system_clock::time_point> poisoned_since) {
  out.family("cubridge_process_poisoned",
             "1 once a sticky CUDA error poisoned this process (only a new process recovers), "
             "else 0.",
             metric_type::gauge);
  out.sample(poisoned ? std::uint64_t{1} : std::uint64_t{0});
  if (!poisoned || !poisoned_since) return;
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(poisoned_since->time_since_epoch()).count();
  out.family("cubridge_process_poisoned_since_seconds",
             "When the sticky CUDA error that poisoned this process was seen (unix time).",
             metric_type::gauge);
  out.sample(seconds > 0 ? static_cast<std::uint64_t>(seconds) : 0);
}

}  // namespace cubridge
