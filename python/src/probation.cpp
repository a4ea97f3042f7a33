// cubridge.ProbationPolicy: the numbers of a probation (swap/probation.hpp) as Python sets them,
// for HotModule.stage(probation=...). Each attribute is checked as it is set; checks are named by
// output_check's own spellings. Replays are not offered from Python: a probation there is made of
// mirrored live launches only.
#include "bindings.hpp"

#include <cubridge/core/detail/printable.hpp>
#include <cubridge/swap/probation.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

constexpr const char* policy_name = "ProbationPolicy";

/// Every output_check, in order: to_string's table answers "?" past its last value, so a check
/// added in C++ is taken here without a second list.
std::vector<output_check> every_check() {
  std::vector<output_check> out;
  for (int i = 0; to_string(static_cast<output_check>(i)) != "?"; ++i)
    out.push_back(static_cast<output_check>(i));
  return out;
}

/// The output_check `name` spells, exactly. @throws error (errc::precondition) naming `what` and
/// the names there are.
output_check check_named(const std::string& name, const std::string& what) {
  std::string names;
  for (const auto c : every_check()) {
    if (to_string(c) == name) return c;
    names += (names.empty() ? "" : ", ") + std::string(to_string(c));
  }
  detail::throw_errc(errc::precondition, policy_name,
                     what + " " + detail::printable(name) + " is no check (" + names + ")");
}

/// A positive number of seconds as milliseconds (at least 1). @throws error (precondition).
std::chrono::milliseconds milliseconds_of(double seconds, const char* attribute) {
  constexpr double a_year = 365.0 * 24 * 3600;
  CUBRIDGE_EXPECTS(std::isfinite(seconds) && seconds > 0 && seconds <= a_year,
                   std::string(policy_name) + "." + attribute +
                       " must be positive seconds, at most a year, not " + std::to_string(seconds));
  return std::chrono::milliseconds(std::max(1LL, std::llround(seconds * 1000)));
}

double seconds_of(std::chrono::milliseconds ms) {
  return std::chrono::duration<double>(ms).count();
}

std::uint32_t at_least_one(std::uint32_t value, const char* attribute, const char* why) {
  CUBRIDGE_EXPECTS(value >= 1,
                   std::string(policy_name) + "." + attribute + " must be at least 1" + why);
  return value;
}

double tolerance_of(nb::handle value, const std::string& what) {
  const auto t = nb::cast<double>(value);
  CUBRIDGE_EXPECTS(std::isfinite(t) && t >= 0,
                   what + " must be a finite number, 0 or more, not " + std::to_string(t));
  return t;
}

/// checks[kernel]: {"check": str, "absolute": float, "relative": float,
/// "ignored_parameters": [int]}, each optional; any other key is refused (a typo must not pass).
kernel_check check_of(const std::string& kernel, nb::handle spec) {
  const std::string what = std::string(policy_name) + ".checks[" + detail::printable(kernel) + "]";
  CUBRIDGE_EXPECTS(nb::isinstance<nb::dict>(spec),
                   what + " must be a dict of check, absolute, relative and ignored_parameters");
  kernel_check c;
  c.kernel = kernel;
  for (const auto& [key, value] : nb::borrow<nb::dict>(spec)) {
    const auto name = nb::cast<std::string>(key);
    if (name == "check")
      c.check = check_named(nb::cast<std::string>(value), what + "['check']");
    else if (name == "absolute")
      c.absolute = tolerance_of(value, what + "['absolute']");
    else if (name == "relative")
      c.relative = tolerance_of(value, what + "['relative']");
    else if (name == "ignored_parameters")
      c.ignored_parameters = nb::cast<std::vector<std::uint32_t>>(value);
    else
      detail::throw_errc(errc::precondition, policy_name,
                         what + " has key " + detail::printable(name) +
                             "; the keys are check, absolute, relative and ignored_parameters");
  }
  return c;
}

std::vector<kernel_check> checks_of(nb::handle checks) {
  std::vector<kernel_check> out;
  if (checks.is_none()) return out;
  CUBRIDGE_EXPECTS(nb::isinstance<nb::dict>(checks),
                   std::string(policy_name) + ".checks must be a dict {kernel: {...}}");
  for (const auto& [kernel, spec] : nb::borrow<nb::dict>(checks))
    out.push_back(check_of(nb::cast<std::string>(kernel), spec));
  return out;
}

nb::dict checks_dict(const probation_policy& p) {
  nb::dict out;
  for (const auto& c : p.checks) {
    nb::dict d;
    d["check"] = std::string(to_string(c.check));
    d["absolute"] = c.absolute;
    d["relative"] = c.relative;
    d["ignored_parameters"] = nb::cast(c.ignored_parameters);
    out[nb::str(c.kernel.data(), c.kernel.size())] = d;
  }
  return out;
}

std::string repr_of(const probation_policy& p) {
  const auto repr = [](nb::handle h) { return std::string(nb::repr(h).c_str()); };
  return std::string(policy_name) + "(required_launches=" + std::to_string(p.required_launches) +
         ", sample_every=" + std::to_string(p.sample_every) +
         ", max_snapshot_bytes=" + std::to_string(p.max_snapshot_bytes) +
         ", deadline_s=" + repr(nb::float_(seconds_of(p.deadline))) +
         ", run_timeout_s=" + repr(nb::float_(seconds_of(p.run_timeout))) + ", default_check='" +
         std::string(to_string(p.default_check)) + "', checks=" + repr(checks_dict(p)) + ")";
}

constexpr const char* no_replays = " (replays are not offered from Python)";

// The counts and durations, each checked as it is set.
void bind_policy_numbers(nb::class_<probation_policy>& c) {
  c.def_prop_rw(
       "required_launches", [](const probation_policy& p) { return p.required_launches; },
       [](probation_policy& p, std::uint32_t n) {
         p.required_launches = at_least_one(n, "required_launches", no_replays);
       },
       "Mirrored launches that must pass (no fault, no mismatch) before the version is let "
       "through; at least 1.")
      .def_prop_rw(
          "sample_every", [](const probation_policy& p) { return p.sample_every; },
          [](probation_policy& p, std::uint32_t n) {
            p.sample_every = at_least_one(n, "sample_every", "");
          },
          "Mirror one serving launch in every sample_every (1: every launch); the first is "
          "always mirrored.")
      .def_prop_rw(
          "max_snapshot_bytes", [](const probation_policy& p) { return p.max_snapshot_bytes; },
          [](probation_policy& p, std::size_t n) {
            CUBRIDGE_EXPECTS(n >= 1, "ProbationPolicy.max_snapshot_bytes must be at least 1");
            p.max_snapshot_bytes = n;
          },
          "The most bytes of allocations one mirrored launch may copy; a launch over it is not "
          "mirrorable (counted, skipped).")
      .def_prop_rw(
          "deadline_s", [](const probation_policy& p) { return seconds_of(p.deadline); },
          [](probation_policy& p, double s) { p.deadline = milliseconds_of(s, "deadline_s"); },
          "Seconds the probation may wait for its launches: fewer than required_launches "
          "passed by then refuses the version (probation_incomplete).")
      .def_prop_rw(
          "run_timeout_s", [](const probation_policy& p) { return seconds_of(p.run_timeout); },
          [](probation_policy& p, double s) {
            p.run_timeout = milliseconds_of(s, "run_timeout_s");
          },
          "Seconds one mirrored run may take in the worker; a candidate that takes longer is "
          "refused as faulted.");
}

// How outputs are compared: the default check and the per-kernel ones.
void bind_policy_checks(nb::class_<probation_policy>& c) {
  c.def_prop_rw(
       "default_check",
       [](const probation_policy& p) { return std::string(to_string(p.default_check)); },
       [](probation_policy& p, const std::string& name) {
         p.default_check = check_named(name, "ProbationPolicy.default_check");
       },
       "How a kernel's outputs are compared unless checks names it: 'bitwise', "
       "'float_tolerance', 'fault_only' or 'never_mirror'.")
      .def_prop_rw(
          "checks", &checks_dict,
          [](probation_policy& p, nb::handle checks) { p.checks = checks_of(checks); },
          "Per kernel, {kernel: {'check': name, 'absolute': float, 'relative': float, "
          "'ignored_parameters': [index, ...]}} (each key optional); float_tolerance passes "
          "|a - b| <= absolute + relative * |a|. Reads as a copy: assign a new dict.");
}

}  // namespace

probation_policy probation_for(const probation_policy& policy,
                               const std::vector<std::string>& kernel_names) {
  auto out = policy;
  for (auto& c : out.checks) c.kernel = resolve_kernel_name(kernel_names, c.kernel);
  return out;
}

void bind_probation_policy(nb::module_& m) {
  const probation_policy defaults;
  nb::class_<probation_policy> c(
      m, "ProbationPolicy",
      "The numbers of a probation (docs/hot-swap.md, 'Probation'), for "
      "HotModule.stage(probation=...): the staged version runs beside the serving one on "
      "mirrored live launches in a sandbox worker and must match it before stage returns. Its "
      "attributes can be set; each is checked when set (PreconditionError).");
  c.def(
      "__init__",
      [](probation_policy* self, std::uint32_t required_launches, std::uint32_t sample_every,
         std::size_t max_snapshot_bytes, double deadline_s, double run_timeout_s,
         const std::string& default_check, nb::handle checks) {
        probation_policy p;
        p.required_launches = at_least_one(required_launches, "required_launches", no_replays);
        p.sample_every = at_least_one(sample_every, "sample_every", "");
        CUBRIDGE_EXPECTS(max_snapshot_bytes >= 1,
                         "ProbationPolicy.max_snapshot_bytes must be at least 1");
        p.max_snapshot_bytes = max_snapshot_bytes;
        p.deadline = milliseconds_of(deadline_s, "deadline_s");
        p.run_timeout = milliseconds_of(run_timeout_s, "run_timeout_s");
        p.default_check = check_named(default_check, "ProbationPolicy.default_check");
        p.checks = checks_of(checks);
        new (self) probation_policy(std::move(p));
      },
      nb::kw_only(), nb::arg("required_launches") = defaults.required_launches,
      nb::arg("sample_every") = defaults.sample_every,
      nb::arg("max_snapshot_bytes") = defaults.max_snapshot_bytes,
      nb::arg("deadline_s") = seconds_of(defaults.deadline),
      nb::arg("run_timeout_s") = seconds_of(defaults.run_timeout),
      nb::arg("default_check") = std::string(to_string(defaults.default_check)),
      nb::arg("checks").none() = nb::none(),
      "required_launches mirrored launches of one in every sample_every must match before "
      "deadline_s; a launch copying more than max_snapshot_bytes is not mirrorable; a run "
      "longer than run_timeout_s counts as a fault. checks: {kernel: {'check': ..., "
      "'absolute': ..., 'relative': ..., 'ignored_parameters': [...]}}.");
  bind_policy_numbers(c);
  bind_policy_checks(c);
  c.def("__repr__", &repr_of);
}

}  // namespace cubridge::python
