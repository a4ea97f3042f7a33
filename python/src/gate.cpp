// cubridge.UpdateGate: the one update gate of a node (update/update_gate.hpp) over its
// HotModules, shared by its doors as in C++: UpdateEndpoint(gate=...) and FleetAgent(gate=...)
// decide with the same replay state, one apply at a time per module. The gate holds the C++
// hot modules through a hot_module_sink, and their Python objects here.
#include "bindings.hpp"

#include <cubridge/core/error.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <utility>

namespace nb = nanobind;

namespace cubridge::python {

update_gate_options gate_options_of(const gate_settings& s, const std::vector<public_key>& keys,
                                    const char* who) {
  update_gate_options o;
  for (const auto& k : keys) o.keys.add(k);
  o.state_file = s.state_file;
  o.persist_state = s.persist_state;
  o.version_floor.insert(s.version_floor.begin(), s.version_floor.end());
  o.require_expiry = s.require_expiry;
  if (s.max_bundle_age_s) {
    CUBRIDGE_EXPECTS(*s.max_bundle_age_s > 0, std::string(who) + " max_bundle_age_s must be > 0");
    o.max_bundle_age = std::chrono::seconds(static_cast<std::int64_t>(*s.max_bundle_age_s));
  }
  CUBRIDGE_EXPECTS(s.rollback_window_s > 0, std::string(who) + " rollback_window_s must be > 0");
  o.rollback_window = std::chrono::seconds(static_cast<std::int64_t>(s.rollback_window_s));
  return o;
}

py_update_gate::py_update_gate(nb::handle hot_modules, const std::vector<public_key>& keys,
                               const gate_settings& settings, const char* who)
    : sink_(std::make_shared<hot_module_sink>()),
      gate_(update_gate::create(sink_, gate_options_of(settings, keys, who))),
      who_(who) {
  if (hot_modules.is_none()) return;
  if (nb::isinstance<py_hot_module>(hot_modules) ||
      nb::isinstance<py_hot_module_group>(hot_modules)) {
    add(hot_modules);
  } else {
    for (nb::handle h : hot_modules) add(h);
  }
}

void py_update_gate::add(nb::handle hot_module, const probation_policy* probation) {
  stage_options stage;
  if (nb::isinstance<py_hot_module>(hot_module)) {
    const auto& h = nb::cast<py_hot_module&>(hot_module);
    if (probation) stage.probation = probation_for(*probation, h.kernel_names);
    sink_->add(h.hot, std::move(stage));
  } else if (nb::isinstance<py_hot_module_group>(hot_module)) {
    const auto& g = nb::cast<py_hot_module_group&>(hot_module);
    if (probation) stage.probation = probation_for(*probation, g.kernel_names);
    sink_->add(g.group, std::move(stage));  // every member at once
  } else
    detail::throw_errc(errc::precondition, "cubridge." + who_,
                       std::string("a ") + Py_TYPE(hot_module.ptr())->tp_name +
                           " is no HotModule or HotModuleGroup: a gate serves those");
  modules_.push_back(nb::borrow(hot_module));
}

nb::list py_update_gate::modules() const {
  nb::list out;
  for (const auto& m : modules_) out.append(m);
  return out;
}

nb::object gate_for(nb::handle gate, nb::handle hot_modules, nb::handle keys,
                    const gate_settings& settings, const char* who) {
  if (!gate.is_none()) {
    if (!nb::isinstance<py_update_gate>(gate))
      detail::throw_errc(
          errc::precondition, std::string("cubridge.") + who,
          std::string("gate= takes an UpdateGate, not a ") + Py_TYPE(gate.ptr())->tp_name);
    if (!hot_modules.is_none() || !keys.is_none())
      detail::throw_errc(errc::precondition, std::string("cubridge.") + who,
                         "give either gate= (its modules and keys) or hot_modules and "
                         "public_keys, not both: a node has one gate");
    if (!(settings == gate_settings{}))
      detail::throw_errc(errc::precondition, std::string("cubridge.") + who,
                         "state_file, persist_state, version_floor, require_expiry, "
                         "max_bundle_age_s and rollback_window_s belong to the gate: give them "
                         "to UpdateGate(...)");
    return nb::borrow(gate);
  }
  if (hot_modules.is_none() || keys.is_none())
    detail::throw_errc(errc::precondition, std::string("cubridge.") + who,
                       "needs hot_modules and public_keys, or gate=UpdateGate(...)");
  // A private gate, as the constructors before UpdateGate built.
  const auto list = nb::cast<std::vector<public_key>>(keys);
  return nb::cast(new py_update_gate(hot_modules, list, settings, who),
                  nb::rv_policy::take_ownership);
}

namespace {

nb::dict decision_dict(const gate_decision& d) {
  nb::dict out;
  out["outcome"] = std::string(to_string(d.outcome));
  out["reason"] = std::string(to_string(d.reason));
  out["module"] = d.module;
  out["version"] = d.version;
  out["serving_version"] = d.serving_version;
  out["previous_version"] = d.previous_version;
  out["detail"] = d.detail;
  return out;
}

}  // namespace

void bind_update_gate(nb::module_& m) {
  nb::class_<py_update_gate>(
      m, "UpdateGate",
      "The one update gate of a node (docs/update-endpoint.md): it verifies signed bundles and "
      "rollback requests against `public_keys`, refuses replays with one replay state, applies "
      "one version at a time per module into `hot_modules`, and promotes a version only if it is "
      "still above the serving one at the switch. Share it between the doors of a node: "
      "UpdateEndpoint(gate=g) and FleetAgent(gate=g).")
      .def(
          "__init__",
          [](py_update_gate* self, nb::handle hot_modules, const std::vector<public_key>& keys,
             std::string state_file, bool persist_state,
             std::map<std::string, std::uint64_t> version_floor, bool require_expiry,
             std::optional<double> max_bundle_age_s, double rollback_window_s) {
            const gate_settings s{std::move(state_file), persist_state,    std::move(version_floor),
                                  require_expiry,        max_bundle_age_s, rollback_window_s};
            new (self) py_update_gate(hot_modules, keys, s, "UpdateGate");
          },
          nb::arg("hot_modules"), nb::arg("public_keys"), nb::kw_only(), nb::arg("state_file") = "",
          nb::arg("persist_state") = true,
          nb::arg("version_floor") = std::map<std::string, std::uint64_t>{},
          nb::arg("require_expiry") = false, nb::arg("max_bundle_age_s") = nb::none(),
          nb::arg("rollback_window_s") = 300.0,
          "A gate over `hot_modules` (a HotModule, a HotModuleGroup or a list of them; each "
          "serves updates under its name, from its label on), trusting `public_keys`. "
          "state_file / persist_state / version_floor / require_expiry / max_bundle_age_s / "
          "rollback_window_s as UpdateEndpoint's. Started (its state file locked) by its first "
          "door, or by start().")
      .def(
          "add",
          [](py_update_gate& g, nb::handle hot_module, const probation_policy* probation) {
            g.add(hot_module, probation);
          },
          nb::arg("hot_module"), nb::kw_only(), nb::arg("probation").none() = nb::none(),
          "Serves one more HotModule or HotModuleGroup, through every door of the gate. "
          "probation: a ProbationPolicy every version that arrives for it goes through before "
          "it may serve (the node's per-module policy; docs/hot-swap.md, 'Probation').")
      .def(
          "start",
          [](py_update_gate& g) {
            nb::gil_scoped_release unlocked;
            g.gate().start();
          },
          "Loads the replay state and locks its file (each door calls it too; idempotent).")
      .def(
          "serving",
          [](const py_update_gate& g, const std::string& module) {
            return g.gate().serving(module);
          },
          nb::arg("module"), "The bundle version of `module` serving now; 0 when none.")
      .def(
          "push",
          [](py_update_gate& g, nb::bytes bundle, const std::string& module) {
            const auto* data =
                static_cast<const std::byte*>(static_cast<const void*>(bundle.c_str()));
            const std::span<const std::byte> body(data, bundle.size());
            gate_decision d;
            {
              nb::gil_scoped_release unlocked;
              d = g.gate().push(body, module);
            }
            return decision_dict(d);
          },
          nb::arg("bundle"), nb::arg("module") = "",
          "Decides about a signed bundle and applies it when it passes, as a door would; returns "
          "{'outcome', 'reason', 'module', 'version', 'serving_version', 'previous_version', "
          "'detail'}.")
      .def_prop_ro(
          "started", [](const py_update_gate& g) { return g.gate().started(); },
          "True once the replay state is loaded.")
      .def_prop_ro(
          "state_file", [](const py_update_gate& g) { return g.gate().state_file().string(); },
          "The replay state file in use ('' when in memory only, or before start).")
      .def_prop_ro("hot_modules", &py_update_gate::modules, "The HotModules served.");
}

}  // namespace cubridge::python
