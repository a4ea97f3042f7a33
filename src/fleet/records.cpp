// Result records and heartbeats as JSON (fleet_records.hpp). Every text is made printable and cut
// on the way out and again on the way in: what a reader prints never carries a terminal escape.
#include <cubridge/bundle/bundle.hpp>  // detail::format_time, parse_time
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/version.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace cubridge::fleet {
namespace {

using json = nlohmann::json;

// Printable ASCII, anything else as '?', cut with "...": the same on the way in and out, so
// that a record read and written again is unchanged.
std::string bounded(std::string_view text, std::size_t max_bytes) {
  return detail::printable(text, {.max_bytes = max_bytes,
                                  .quoted = false,
                                  .escape = detail::printable_escape::question_mark,
                                  .cut = detail::printable_cut::ellipsis});
}

// Whether `name` is a module name or node id as a fleet takes them (a record naming another is
// refused when read).
bool valid_name(std::string_view name) {
  return check_fleet_name(name, "name").empty();
}

double milliseconds(double value) {
  return std::isfinite(value) && value >= 0 ? value : 0;
}

json record_json(const result_record& r) {
  return {{"node", bounded(r.node, max_fleet_name)},
          {"module", bounded(r.module, max_fleet_name)},
          {"revision", r.revision},
          {"digest", bounded(r.digest, 64)},
          {"version", r.version},
          {"serving_version", r.serving_version},
          {"outcome", std::string(to_string(r.outcome))},
          {"reason", bounded(r.reason, max_record_token)},
          {"detail", bounded(r.detail, max_record_detail)},
          {"verify_ms", milliseconds(r.verify_ms)},
          {"apply_ms", milliseconds(r.apply_ms)},
          {"time", cubridge::detail::format_time(r.time)}};
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Field readers: nullopt when missing or of another type. A text that to_json wrote (cut with
// "...") comes back as it was.
std::optional<std::string> text_field(const json& j, const char* key, std::size_t max_bytes) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  const auto& text = it->get_ref<const std::string&>();
  // Up to 3 bytes more is a text to_json cut ("..."): kept as it is; longer is cut here.
  return bounded(text, text.size() <= max_bytes + 3 ? max_bytes + 3 : max_bytes);
}

std::optional<std::string> name_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string() || !valid_name(it->get_ref<const std::string&>()))
    return std::nullopt;
  return it->get<std::string>();
}

std::optional<std::uint64_t> count_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<std::uint64_t>();
}

std::optional<double> ms_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return milliseconds(it->get<double>());
}

std::optional<std::chrono::sys_seconds> time_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  const auto time = cubridge::detail::parse_time(it->get_ref<const std::string&>());
  if (!time || *time < earliest_record_time || *time > latest_record_time) return std::nullopt;
  return time;
}

// A digest is 64 lower-case hex digits; an empty one is a record about no bundle.
std::optional<std::string> digest_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  const auto& text = it->get_ref<const std::string&>();
  if (!text.empty() && !cubridge::detail::is_lower_hex(text, 64)) return std::nullopt;
  return text;
}

std::optional<json> parse_object(std::string_view text) {
  if (text.size() > max_record_bytes) return std::nullopt;
  auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

std::optional<result_record> record_of(const json& j) {
  if (!j.is_object()) return std::nullopt;
  result_record r;
  const auto node = name_field(j, "node");
  const auto module = name_field(j, "module");
  const auto revision = count_field(j, "revision");
  const auto digest = digest_field(j, "digest");
  const auto version = count_field(j, "version");
  const auto serving = count_field(j, "serving_version");
  const auto outcome_text = text_field(j, "outcome", max_record_token);
  const auto outcome = outcome_text ? parse_gate_outcome(*outcome_text) : std::nullopt;
  const auto reason = text_field(j, "reason", max_record_token);
  const auto detail = text_field(j, "detail", max_record_detail);
  const auto verify_ms = ms_field(j, "verify_ms");
  const auto apply_ms = ms_field(j, "apply_ms");
  const auto time = time_field(j, "time");
  if (!node || !module || !revision || !digest || !version || !serving || !outcome || !reason ||
      !detail || !verify_ms || !apply_ms || !time)
    return std::nullopt;
  return result_record{*node,    *module, *revision, *digest,    *version,  *serving,
                       *outcome, *reason, *detail,   *verify_ms, *apply_ms, *time};
}

json health_json(const module_health& h) {
  json values = json::object();
  std::size_t listed = 0;
  for (const auto& [name, value] : h.values) {
    if (listed++ == max_health_values) break;
    if (std::isfinite(value)) values[bounded(name, max_fleet_name)] = value;
  }
  return {{"version", h.version},
          {"launches", h.launches},
          {"launch_failures", h.launch_failures},
          {"sticky_error", bounded(h.sticky_error, max_record_token)},
          {"healthy", h.healthy},
          {"values", std::move(values)},
          {"detail", bounded(h.detail, max_health_detail)}};
}

std::optional<module_health> health_of(const json& j) {
  if (!j.is_object()) return std::nullopt;
  module_health h;
  const auto version = count_field(j, "version");
  const auto launches = count_field(j, "launches");
  const auto failures = count_field(j, "launch_failures");
  const auto sticky = text_field(j, "sticky_error", max_record_token);
  const auto healthy = j.find("healthy");
  const auto values = j.find("values");
  const auto detail = text_field(j, "detail", max_health_detail);
  if (!version || !launches || !failures || !sticky || healthy == j.end() ||
      !healthy->is_boolean() || values == j.end() || !values->is_object() ||
      values->size() > max_health_values || !detail)
    return std::nullopt;
  for (const auto& [name, value] : values->items()) {
    if (!valid_name(name) || !value.is_number() || !std::isfinite(value.get<double>()))
      return std::nullopt;
    h.values[name] = value.get<double>();
  }
  h.version = *version;
  h.launches = *launches;
  h.launch_failures = *failures;
  h.sticky_error = *sticky;
  h.healthy = healthy->get<bool>();
  h.detail = *detail;
  return h;
}

json poison_json(const poison_report& p) {
  return {{"error", bounded(p.error, max_record_token)},
          {"call", bounded(p.call, max_record_token)},
          {"since", cubridge::detail::format_time(p.since)}};
}

// Exactly the three fields, as poison_json writes them.
std::optional<poison_report> poison_of(const json& j) {
  if (!j.is_object() || j.size() != 3) return std::nullopt;
  const auto error = text_field(j, "error", max_record_token);
  const auto call = text_field(j, "call", max_record_token);
  const auto since = time_field(j, "since");
  if (!error || !call || !since) return std::nullopt;
  return poison_report{*error, *call, *since};
}

}  // namespace

std::string software_text() {
  return "cubridge " + std::string(cubridge::version());
}

std::string to_json(const result_record& record) {
  return dump(record_json(record));
}

bool is_boot_id(std::string_view boot) noexcept {
  return boot.size() == 16 && std::all_of(boot.begin(), boot.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string to_json(const heartbeat& beat) {
  json versions = json::object(), revisions = json::object();
  std::size_t listed = 0;
  for (const auto& [name, version] : beat.versions) {
    if (listed++ == max_heartbeat_modules) break;
    versions[bounded(name, max_fleet_name)] = version;
  }
  listed = 0;
  for (const auto& [name, revision] : beat.revisions) {
    if (listed++ == max_heartbeat_modules) break;
    revisions[bounded(name, max_fleet_name)] = revision;
  }
  json health = json::object();
  listed = 0;
  for (const auto& [name, h] : beat.health) {
    if (listed++ == max_heartbeat_modules) break;
    health[bounded(name, max_fleet_name)] = health_json(h);
  }
  json j{{"node", bounded(beat.node, max_fleet_name)},
         {"cohort", bounded(beat.cohort, max_record_token)},
         {"gpu", bounded(beat.gpu, max_record_token)},
         {"interval_ms", beat.interval.count() > 0 ? beat.interval.count() : 0},
         {"time", cubridge::detail::format_time(beat.time)},
         {"software", bounded(beat.software, max_record_token)},
         {"health", std::move(health)},
         {"versions", std::move(versions)},
         {"revisions", std::move(revisions)},
         {"connected", beat.connected},
         {"last_result", beat.last_result ? record_json(*beat.last_result) : json(nullptr)}};
  if (!beat.boot.empty()) {
    j["boot"] = bounded(beat.boot, 16);
    j["sequence"] = beat.sequence;
    j["started"] = cubridge::detail::format_time(beat.started);
  }
  if (!beat.problem.empty()) j["problem"] = bounded(beat.problem, max_record_detail);
  if (beat.poisoned) j["poisoned"] = poison_json(*beat.poisoned);  // absent while healthy
  return dump(j);
}

std::optional<result_record> parse_result_record(std::string_view text) {
  const auto j = parse_object(text);
  return j ? record_of(*j) : std::nullopt;
}

std::optional<heartbeat> parse_heartbeat(std::string_view text) {
  const auto j = parse_object(text);
  if (!j) return std::nullopt;
  heartbeat h;
  const auto node = name_field(*j, "node");
  const auto cohort = text_field(*j, "cohort", max_record_token);
  const auto gpu = text_field(*j, "gpu", max_record_token);
  const auto interval = count_field(*j, "interval_ms");
  const auto time = time_field(*j, "time");
  const auto versions = j->find("versions");
  const auto revisions = j->find("revisions");
  const auto connected = j->find("connected");
  const auto last = j->find("last_result");
  if (!node || !cohort || !gpu || !interval || !time || versions == j->end() ||
      !versions->is_object() || versions->size() > max_heartbeat_modules || revisions == j->end() ||
      !revisions->is_object() || revisions->size() > max_heartbeat_modules ||
      connected == j->end() || !connected->is_boolean() || last == j->end())
    return std::nullopt;
  h.node = *node;
  h.cohort = *cohort;
  h.gpu = *gpu;
  if (*interval == 0 || *interval > static_cast<std::uint64_t>(max_heartbeat_interval.count()))
    return std::nullopt;
  h.interval = std::chrono::milliseconds(*interval);
  h.time = *time;
  // Optional: a node that predates the field sends none.
  if (j->contains("software")) {
    const auto software = text_field(*j, "software", max_record_token);
    if (!software) return std::nullopt;
    h.software = *software;
  }
  for (const auto& [name, version] : versions->items()) {
    if (!valid_name(name) || !version.is_number_unsigned()) return std::nullopt;
    h.versions[name] = version.get<std::uint64_t>();
  }
  for (const auto& [name, revision] : revisions->items()) {
    if (!valid_name(name) || !revision.is_number_unsigned()) return std::nullopt;
    h.revisions[name] = revision.get<std::uint64_t>();
  }
  h.connected = connected->get<bool>();
  if (const auto health = j->find("health"); health != j->end()) {  // optional: newer nodes
    if (!health->is_object() || health->size() > max_heartbeat_modules) return std::nullopt;
    for (const auto& [name, entry] : health->items()) {
      auto parsed = health_of(entry);
      if (!valid_name(name) || !parsed) return std::nullopt;
      h.health[name] = std::move(*parsed);
    }
  }
  if (!last->is_null()) {
    h.last_result = record_of(*last);
    if (!h.last_result) return std::nullopt;
  }
  // Optional together: a node that predates them sends none.
  if (j->contains("boot")) {
    const auto boot = text_field(*j, "boot", 16);
    const auto sequence = count_field(*j, "sequence");
    const auto started = time_field(*j, "started");
    if (!boot || !is_boot_id(*boot) || !sequence || *sequence == 0 || !started) return std::nullopt;
    h.boot = *boot;
    h.sequence = *sequence;
    h.started = *started;
  }
  if (j->contains("problem")) {
    const auto problem = text_field(*j, "problem", max_record_detail);
    if (!problem) return std::nullopt;
    h.problem = *problem;
  }
  if (const auto poisoned = j->find("poisoned"); poisoned != j->end()) {  // optional: newer nodes
    h.poisoned = poison_of(*poisoned);
    if (!h.poisoned) return std::nullopt;
  }
  return h;
}

}  // namespace cubridge::fleet
