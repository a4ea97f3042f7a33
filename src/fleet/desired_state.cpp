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
  const json j{{"module", s.module},
               {"revision", s.revision},
               {"phase", std::string(to_string(s.phase))},
               {"stable", optional_ref(s.stable)},
               {"candidate", optional_ref(s.candidate)},
               {"canaries", s.canaries},
               {"reason", text_of(s.reason, max_reason_bytes)},
               {"reason_version", s.reason_version},
               {"history", std::move(history)},
               {"time", s.time},
               {"software", text_of(s.software, 64)}};
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
