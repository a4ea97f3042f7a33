// The desired state's JSON body (desired_state.hpp). Read strictly: whatever the bucket holds is
// checked field by field before a node or the control side acts on it.
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>

namespace cubridge::fleet {
namespace {

using json = nlohmann::json;

constexpr std::array<cubridge::detail::enum_name<rollout_phase>, 4> phase_names{{
    {rollout_phase::complete, "complete"},
    {rollout_phase::canary, "canary"},
    {rollout_phase::halted, "halted"},
    {rollout_phase::rolled_back, "rolled_back"},
}};
static_assert(cubridge::detail::lists_values_in_order(phase_names));

constexpr std::size_t max_reason_bytes = 2048;

std::string text_of(std::string_view text, std::size_t max_bytes) {
  return cubridge::detail::printable(text,
                                     {.max_bytes = max_bytes,
                                      .quoted = false,
                                      .escape = cubridge::detail::printable_escape::question_mark,
                                      .cut = cubridge::detail::printable_cut::ellipsis});
}

json ref_json(const bundle_ref& r) {
  return {{"version", r.version}, {"digest", r.digest}, {"size", r.size}, {"target", r.target}};
}

json optional_ref(const std::optional<bundle_ref>& r) {
  return r ? ref_json(*r) : json(nullptr);
}

// Collects the first problem; every reader below returns a value either way.
struct reader {
  std::string problem;
  void fail(std::string what) {
    if (problem.empty()) problem = std::move(what);
  }
  std::uint64_t count(const json& j, const char* key, bool positive = false) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) {
      fail(std::string("'") + key + "' is not a whole number");
      return 0;
    }
    const auto value = it->get<std::uint64_t>();
    if (positive && value == 0) fail(std::string("'") + key + "' is 0");
    return value;
  }
  std::string text(const json& j, const char* key, std::size_t max_bytes) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      fail(std::string("'") + key + "' is not a text");
      return {};
    }
    return text_of(it->get_ref<const std::string&>(), max_bytes);
  }
  std::string name(const json& j, const char* key, std::string_view what) {
    auto value = text(j, key, max_fleet_name + 3);
    if (const auto p = check_fleet_name(value, what); !p.empty() && problem.empty()) fail(p);
    return value;
  }
  std::optional<bundle_ref> ref(const json& j, const char* key) {
    const auto it = j.find(key);
    if (it == j.end()) {
      fail(std::string("'") + key + "' is missing");
      return std::nullopt;
    }
    if (it->is_null()) return std::nullopt;
    if (!it->is_object()) {
      fail(std::string("'") + key + "' is neither a bundle nor null");
      return std::nullopt;
    }
    bundle_ref r;
    r.version = count(*it, "version", true);
    r.digest = text(*it, "digest", 64);
    r.size = count(*it, "size", true);
    r.target = text(*it, "target", 16);
    if (!cubridge::detail::is_lower_hex(r.digest, 64))
      fail(std::string("'") + key + ".digest' is not 64 lower-case hex digits");
    return r;
  }
};

// A whole number of milliseconds from the wire, as a duration (the largest one a record may hold
// saturates rather than wraps).
std::chrono::milliseconds milliseconds_of(std::uint64_t count) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(
      std::min<std::uint64_t>(count, static_cast<std::uint64_t>(INT64_MAX))));
}

// `halted` goes on the wire as records of 0.1.0 have it; a reader takes it from the phase.
json plan_json(const wave_plan& p, bool halted) {
  return {
      {"candidate", ref_json(p.candidate)},
      {"sizes", p.sizes},
      {"nodes", p.nodes},
      {"wave", p.wave},
      {"started", p.started},
      {"bake_ms", static_cast<std::uint64_t>(std::max<std::int64_t>(p.bake.count(), 0))},
      {"deadline_ms", static_cast<std::uint64_t>(std::max<std::int64_t>(p.deadline.count(), 0))},
      {"max_failure_rate", p.max_failure_rate},
      {"max_metrics", p.max_metrics},
      {"baseline_breach", p.baseline_breach_halts ? "halt" : "bake_on"},
      {"max_missed_heartbeats", p.max_missed_heartbeats},
      {"halted", halted}};
}

// The plan's settings for the baseline and the canaries' evidence; both optional: a record of
// 0.1.0 has neither.
void read_evidence_settings(const json& w, reader& r, wave_plan& p) {
  if (const auto breach = w.find("baseline_breach"); breach != w.end()) {
    if (!breach->is_string() || (*breach != "halt" && *breach != "bake_on"))
      r.fail("'waves.baseline_breach' is neither \"halt\" nor \"bake_on\"");
    else
      p.baseline_breach_halts = *breach == "halt";
  }
  if (const auto missed = w.find("max_missed_heartbeats"); missed != w.end()) {
    if (!missed->is_number_unsigned() || missed->get<std::uint64_t>() == 0 ||
        missed->get<std::uint64_t>() > max_missed_heartbeats_limit)
      r.fail("'waves.max_missed_heartbeats' is not a whole number from 1 to " +
             std::to_string(max_missed_heartbeats_limit));
    else
      p.max_missed_heartbeats = static_cast<std::uint32_t>(missed->get<std::uint64_t>());
  }
}

std::optional<wave_plan> read_plan(const json& j, reader& r) {
  const auto it = j.find("waves");
  if (it == j.end() || it->is_null()) return std::nullopt;  // optional: no wave rollout
  if (!it->is_object()) {
    r.fail("'waves' is neither a wave plan nor null");
    return std::nullopt;
  }
  const json& w = *it;
  wave_plan p;
  if (auto candidate = r.ref(w, "candidate"))
    p.candidate = std::move(*candidate);
  else
    r.fail("'waves.candidate' is not a bundle");
  const auto sizes = w.find("sizes");
  const auto nodes = w.find("nodes");
  if (sizes == w.end() || !sizes->is_array() || sizes->empty() || sizes->size() > max_waves ||
      nodes == w.end() || !nodes->is_array() || nodes->size() != sizes->size()) {
    r.fail("'waves.sizes' and 'waves.nodes' are not two lists of 1 to " +
           std::to_string(max_waves) + " waves");
    return std::nullopt;
  }
  std::size_t listed = 0;
  for (std::size_t i = 0; i < sizes->size(); ++i) {
    const auto& size = (*sizes)[i];
    const auto& wave = (*nodes)[i];
    if (!size.is_string() || size.get_ref<const std::string&>().size() > 8 || !wave.is_array()) {
      r.fail("wave " + std::to_string(i) + " is not a size and a list of nodes");
      return std::nullopt;
    }
    p.sizes.push_back(text_of(size.get_ref<const std::string&>(), 8));
    auto& added = p.nodes.emplace_back();
    for (const auto& node : wave) {
      if (!node.is_string() || !check_fleet_name(node.get_ref<const std::string&>(), "n").empty() ||
          ++listed > max_desired_canaries) {
        r.fail("wave " + std::to_string(i) + " holds something that is not a node id");
        return std::nullopt;
      }
      added.push_back(node.get<std::string>());
    }
  }
  p.wave = static_cast<std::size_t>(r.count(w, "wave"));
  if (p.wave >= p.sizes.size()) r.fail("'waves.wave' is past the last wave");
  p.started = r.text(w, "started", 32);
  p.bake = milliseconds_of(r.count(w, "bake_ms"));
  p.deadline = milliseconds_of(r.count(w, "deadline_ms", true));
  const auto rate = w.find("max_failure_rate");
  if (rate == w.end() || !rate->is_number() || !std::isfinite(rate->get<double>()) ||
      rate->get<double>() > 1)
    r.fail("'waves.max_failure_rate' is not a number up to 1");
  else
    p.max_failure_rate = rate->get<double>();
  const auto metrics = w.find("max_metrics");
  if (metrics == w.end() || !metrics->is_object() || metrics->size() > 64) {
    r.fail("'waves.max_metrics' is not an object of at most 64 limits");
  } else {
    for (const auto& [name, limit] : metrics->items()) {
      if (!check_fleet_name(name, "m").empty() || !limit.is_number() ||
          !std::isfinite(limit.get<double>())) {
        r.fail("'waves.max_metrics' holds something that is not a name and a number");
        break;
      }
      p.max_metrics[name] = limit.get<double>();
    }
  }
  read_evidence_settings(w, r, p);
  // Checked as 0.1.0 wrote it; what counts is the record's phase (desired_state::waves_halted).
  if (const auto halted = w.find("halted"); halted == w.end() || !halted->is_boolean())
    r.fail("'waves.halted' is not true or false");
  return p;
}

}  // namespace

std::string_view to_string(rollout_phase phase) noexcept {
  return cubridge::detail::name_of(phase_names, phase, "unknown");
}

std::optional<rollout_phase> parse_rollout_phase(std::string_view name) noexcept {
  return cubridge::detail::value_of(phase_names, name);
}

const bundle_ref* desired_state::target_for(std::string_view node) const {
  if (phase == rollout_phase::canary && candidate &&
      std::binary_search(canaries.begin(), canaries.end(), node))
    return &*candidate;
  return stable ? &*stable : nullptr;
}

std::string to_json(const desired_state& s) {
  json history = json::array();
  for (const auto& r : s.history) history.push_back(ref_json(r));
  const json j{
      {"module", s.module},
      {"revision", s.revision},
      {"phase", std::string(to_string(s.phase))},
      {"stable", optional_ref(s.stable)},
      {"candidate", optional_ref(s.candidate)},
      {"canaries", s.canaries},
      {"reason", text_of(s.reason, max_reason_bytes)},
      {"reason_version", s.reason_version},
      {"history", std::move(history)},
      {"time", s.time},
      {"software", text_of(s.software, 64)},
      {"waves", s.waves ? plan_json(*s.waves, s.phase == rollout_phase::halted) : json(nullptr)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<desired_state> parse_desired_state(std::string_view body, std::string* why) {
  const auto j = json::parse(body, nullptr, false);
  reader r;
  desired_state s;
  if (j.is_discarded() || !j.is_object()) {
    r.fail("desired state is not a JSON object");
  } else {
    s.module = r.name(j, "module", "module name");
    s.revision = r.count(j, "revision", true);
    const auto phase = parse_rollout_phase(r.text(j, "phase", 32));
    if (!phase) r.fail("'phase' is not complete, canary, halted or rolled_back");
    s.phase = phase.value_or(rollout_phase::complete);
    s.stable = r.ref(j, "stable");
    s.candidate = r.ref(j, "candidate");
    const auto canaries = j.find("canaries");
    if (canaries == j.end() || !canaries->is_array() || canaries->size() > max_desired_canaries) {
      r.fail("'canaries' is not a list of at most " + std::to_string(max_desired_canaries));
    } else {
      for (const auto& c : *canaries) {
        if (!c.is_string() || !check_fleet_name(c.get_ref<const std::string&>(), "n").empty()) {
          r.fail("'canaries' holds something that is not a node id");
          break;
        }
        s.canaries.push_back(c.get<std::string>());
      }
      std::sort(s.canaries.begin(), s.canaries.end());
    }
    s.reason = r.text(j, "reason", max_reason_bytes);
    s.reason_version = r.count(j, "reason_version");
    const auto history = j.find("history");
    if (history == j.end() || !history->is_array() || history->size() > max_desired_history) {
      r.fail("'history' is not a list of at most " + std::to_string(max_desired_history));
    } else {
      for (std::size_t i = 0; i < history->size(); ++i) {
        const auto name = "history[" + std::to_string(i) + "]";
        const json wrapped{{name, (*history)[i]}};
        auto ref = r.ref(wrapped, name.c_str());
        if (!ref) {
          r.fail("'" + name + "' is not a bundle");
          break;
        }
        s.history.push_back(std::move(*ref));
      }
    }
    s.time = r.text(j, "time", 32);
    if (j.contains("software")) s.software = r.text(j, "software", 64);  // optional: newer
    s.waves = read_plan(j, r);
    if (s.phase == rollout_phase::canary && (!s.candidate || s.canaries.empty()))
      r.fail("phase canary without a candidate and canaries");
  }
  if (!r.problem.empty()) {
    if (why) *why = r.problem;
    return std::nullopt;
  }
  return s;
}

}  // namespace cubridge::fleet
