// The node side of the fleet (fleet/agent.hpp) in a Python service: a fleet_agent over the
// service's HotModules that reconciles them to the operator-signed desired state and sends
// signed heartbeats, with a Python callable as the service's health probe. The agent's threads
// touch Python only to call the probe, under the GIL; every agent is stopped at interpreter exit
// (atexit), before Python can no longer be called.
#include "bindings.hpp"
#include "fleet_bindings.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

constexpr const char* probe_contract =
    "return True/False or a dict {'healthy': bool, 'values': {name: number}, 'detail': str}";

/// What the probe answered, as a health_report; what it cannot be read as is unhealthy, saying
/// why (a probe that answers nonsense must not pass a wave).
health_report report_of(nb::handle answer) {
  if (PyBool_Check(answer.ptr())) return {answer.ptr() == Py_True, {}, {}};
  if (!PyDict_Check(answer.ptr()))
    return {false,
            {},
            "the health probe returned a " + type_name(answer.ptr()) + ": " + probe_contract};
  health_report r;
  for (auto [key, value] : nb::cast<nb::dict>(answer)) {
    const auto name = nb::isinstance<nb::str>(key) ? nb::cast<std::string>(key) : std::string();
    if (name == "healthy" && PyBool_Check(value.ptr())) {
      r.healthy = value.ptr() == Py_True;
    } else if (name == "detail" && nb::isinstance<nb::str>(value)) {
      r.detail = nb::cast<std::string>(value);
    } else if (name == "values" && PyDict_Check(value.ptr())) {
      for (auto [n, v] : nb::cast<nb::dict>(value)) {
        if (!nb::isinstance<nb::str>(n) ||
            !(nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v)))
          return {false, {}, "the health probe's values must map names to numbers"};
        r.values[nb::cast<std::string>(n)] = nb::cast<double>(v);
      }
    } else {
      return {false,
              {},
              "the health probe's answer has a key '" + nb::cast<std::string>(nb::str(key)) +
                  "' of type " + type_name(value.ptr()) + ": " + probe_contract};
    }
  }
  return r;
}

/// The agent's probe over the Python callable `probe` (borrowed: the FleetAgent holds it and
/// outlives the agent's threads).
health_probe_fn python_probe(PyObject* probe) {
  return [probe](std::string_view module, std::uint64_t version) -> health_report {
    if (!nb::is_alive()) return {false, {}, "the Python interpreter has exited"};
    nb::gil_scoped_acquire gil;
    try {
      return report_of(nb::handle(probe)(std::string(module), version));
    } catch (nb::python_error& e) {
      const auto kind = type_name(e.value().ptr());  // the exception's class
      return {false,
              {},
              "the health probe raised " + kind + ": " + nb::cast<std::string>(nb::str(e.value()))};
    } catch (const std::exception& e) {
      return {false, {}, std::string("the health probe failed: ") + e.what()};
    }
  };
}

/// FleetAgent's keywords that AgentOptions stands for, each nullopt when left out.
struct agent_keywords {
  bus_keywords bus;
  std::optional<std::string> node;
  std::optional<std::string> node_key_file;
  std::optional<std::vector<std::string>> modules;
  std::optional<std::string> cohort;
  std::optional<double> heartbeat_interval_s;
  std::optional<double> resync_interval_s;
  std::optional<bool> allow_readable_key;
};

/// What FleetAgent runs with: `options` (an AgentOptions) or the keywords it stands for, never
/// both. @throws error (errc::precondition) for both, or for neither options nor node and
/// node_key_file.
agent_settings agent_settings_of(const agent_settings* options, agent_keywords k) {
  constexpr const char* who = "cubridge.FleetAgent";
  if (options != nullptr) {
    if (k.node || k.node_key_file)
      detail::throw_errc(errc::precondition, who,
                         "FleetAgent takes node= and node_key_file=, or options=, not both");
    if (k.bus.any() || k.modules || k.cohort || k.heartbeat_interval_s || k.resync_interval_s ||
        k.allow_readable_key)
      detail::throw_errc(errc::precondition, who,
                         "FleetAgent takes servers=, credentials=, ca_file=, api_prefix=, "
                         "modules=, cohort=, heartbeat_interval_s=, resync_interval_s= and "
                         "allow_readable_key=, or options= (an AgentOptions has them), not both");
    return *options;
  }
  if (!k.node || !k.node_key_file)
    detail::throw_errc(errc::precondition, who,
                       "FleetAgent needs node= and node_key_file= (or options=)");
  agent_settings s;
  s.bus = k.bus.settings();
  s.node = std::move(*k.node);
  s.node_key_file = std::move(*k.node_key_file);
  s.allow_readable_key = k.allow_readable_key.value_or(s.allow_readable_key);
  if (k.modules) s.modules = std::move(*k.modules);
  if (k.cohort) s.cohort = std::move(*k.cohort);
  s.heartbeat_interval_s = k.heartbeat_interval_s.value_or(s.heartbeat_interval_s);
  s.resync_interval_s = k.resync_interval_s.value_or(s.resync_interval_s);
  return s;
}

std::string repr_of_agent(const agent_settings& s) {
  return "AgentOptions(node=" + python_repr(nb::cast(s.node)) +
         ", node_key_file=" + python_repr(nb::cast(s.node_key_file)) + ", bus=" + repr_of(s.bus) +
         ", modules=" + python_repr(nb::cast(s.modules)) +
         ", cohort=" + python_repr(nb::cast(s.cohort)) +
         ", heartbeat_interval_s=" + python_repr(nb::cast(s.heartbeat_interval_s)) +
         ", resync_interval_s=" + python_repr(nb::cast(s.resync_interval_s)) +
         ", allow_readable_key=" + (s.allow_readable_key ? "True" : "False") + ")";
}

void bind_agent_options(nb::module_& m) {
  nb::class_<agent_settings>(
      m, "AgentOptions",
      "What a FleetAgent runs with besides its modules, keys and probe (fleet_agent_options), "
      "for FleetAgent(options=...). Its attributes can be set; they are checked when an agent "
      "is built with them.")
      .def(
          "__init__",
          [](agent_settings* self, std::string node, std::string node_key_file,
             const bus_settings* bus, std::vector<std::string> modules, std::string cohort,
             double heartbeat_interval_s, double resync_interval_s, bool allow_readable_key) {
            new (self) agent_settings{bus != nullptr ? *bus : bus_settings{},
                                      std::move(node),
                                      std::move(node_key_file),
                                      allow_readable_key,
                                      std::move(modules),
                                      std::move(cohort),
                                      heartbeat_interval_s,
                                      resync_interval_s};
          },
          nb::kw_only(), nb::arg("node"), nb::arg("node_key_file"), nb::arg("bus") = nb::none(),
          nb::arg("modules") = std::vector<std::string>{}, nb::arg("cohort") = "all",
          nb::arg("heartbeat_interval_s") = 5.0, nb::arg("resync_interval_s") = 2.0,
          nb::arg("allow_readable_key") = false,
          "Node `node` (enrolled with the public half of node_key_file), talking over `bus` (a "
          "BusOptions, copied; None: BusOptions()), following `modules` (empty: every module "
          "its gate serves), with a heartbeat every heartbeat_interval_s and the desired state "
          "read again every resync_interval_s; allow_readable_key: sign with a key file others "
          "may read.")
      .def_rw("node", &agent_settings::node, "The node's id, 1 to 64 of [A-Za-z0-9_-].")
      .def_rw("node_key_file", &agent_settings::node_key_file,
              "The node's secret key file: signs its results and heartbeats.")
      .def_rw("bus", &agent_settings::bus, "The BusOptions it talks over (this one, not a copy).")
      .def_rw("modules", &agent_settings::modules,
              "The modules to follow (empty: every module its gate serves); assign a new list, "
              "as the list read is a copy.")
      .def_rw("cohort", &agent_settings::cohort, "The label its heartbeats carry (informative).")
      .def_rw("heartbeat_interval_s", &agent_settings::heartbeat_interval_s,
              "Seconds between heartbeats.")
      .def_rw("resync_interval_s", &agent_settings::resync_interval_s,
              "Seconds between reads of the desired state besides the watch.")
      .def_rw("allow_readable_key", &agent_settings::allow_readable_key,
              "Whether a node key file that group or others may read is taken.")
      .def("__repr__", &repr_of_agent);
}

class py_fleet_agent;

/// `work()` without the GIL, whether the caller holds it or not: the heartbeat thread may be
/// waiting for it inside the probe while the caller waits for that thread (stop) or for the
/// lock of the live agents that stop_all holds while it stops them.
template <class Work>
void without_gil(Work work) {
  if (PyGILState_Check()) {
    nb::gil_scoped_release unlocked;
    work();
  } else {
    work();
  }
}

/// The agents alive, stopped at interpreter exit (their threads must not call the probe then).
struct live_agents {
  std::mutex mutex;
  std::set<py_fleet_agent*> agents;
};
live_agents& live() {
  static auto* const all = new live_agents;  // never destroyed: an agent may outlive statics
  return *all;
}

class py_fleet_agent {
 public:
  /// An agent deciding with `gate` (an UpdateGate, shared or private).
  py_fleet_agent(nb::object gate, const agent_settings& s, nb::object probe)
      : settings_(s), probe_(std::move(probe)), gate_(std::move(gate)) {
    fleet_agent_options o;
    o.bus = bus_options_of(s.bus);
    o.node = s.node;
    o.node_key_file = s.node_key_file;
    o.allow_readable_key = s.allow_readable_key;
    o.modules = s.modules;
    o.cohort = s.cohort;
    o.heartbeat_interval = milliseconds_of(s.heartbeat_interval_s, "heartbeat_interval_s");
    o.resync_interval = milliseconds_of(s.resync_interval_s, "resync_interval_s");
    if (!probe_.is_none()) {
      CUBRIDGE_EXPECTS(PyCallable_Check(probe_.ptr()),
                       "FleetAgent health_probe must be callable(module, version)");
      o.health_probe = python_probe(probe_.ptr());
    }
    agent_ = std::make_unique<fleet_agent>(this->gate().shared(), std::move(o));
    without_gil([this] {
      std::lock_guard lock(live().mutex);
      live().agents.insert(this);
    });
  }
  py_fleet_agent(const py_fleet_agent&) = delete;
  py_fleet_agent& operator=(const py_fleet_agent&) = delete;
  ~py_fleet_agent() {
    without_gil([this] {
      {
        std::lock_guard lock(live().mutex);
        live().agents.erase(this);
      }
      agent_->stop();
    });
  }

  void start() {
    nb::gil_scoped_release unlocked;  // the probe may be called at once, on another thread
    agent_->start();
  }
  void stop() noexcept {
    without_gil([this] { agent_->stop(); });
  }
  [[nodiscard]] const fleet_agent& get() const { return *agent_; }
  [[nodiscard]] py_update_gate& gate() const { return nb::cast<py_update_gate&>(gate_); }
  [[nodiscard]] nb::object gate_object() const { return gate_; }
  [[nodiscard]] const agent_settings& settings() const noexcept { return settings_; }

  /// Every live agent stopped (atexit). The lock is taken without the GIL, as the destructor
  /// takes it: a thread destroying an agent holds the lock while it waits for that agent's
  /// heartbeat thread, which may be waiting for the GIL inside the probe.
  static void stop_all() {
    without_gil([] {
      std::lock_guard lock(live().mutex);
      for (auto* agent : live().agents) agent->stop();
    });
  }

 private:
  agent_settings settings_;  // as given, for FleetAgent.options
  // Declared before agent_, destroyed after it: the agent's threads call the probe and the
  // gate's sink until agent_ is gone.
  nb::object probe_;
  nb::object gate_;  // the UpdateGate
  std::unique_ptr<fleet_agent> agent_;
};

nb::dict stats_of(const fleet_agent& a) {
  const auto s = a.stats();
  nb::dict d;
  d["applied"] = s.applied;
  d["duplicates"] = s.duplicates;
  d["refused"] = s.refused;
  d["retries"] = s.retries;
  d["records_published"] = s.records_published;
  d["publish_failures"] = s.publish_failures;
  d["heartbeats"] = s.heartbeats;
  d["connects"] = s.connects;
  d["desired_refused"] = s.desired_refused;
  d["links_replaced"] = s.links_replaced;
  return d;
}

void bind_agent_state(nb::class_<py_fleet_agent>& c) {
  c.def_prop_ro(
       "running", [](const py_fleet_agent& a) { return a.get().running(); },
       "True between start() and stop().")
      .def_prop_ro(
          "connected", [](const py_fleet_agent& a) { return a.get().connected(); },
          "Whether the agent is connected and watching the desired state.")
      .def_prop_ro(
          "connected_server", [](const py_fleet_agent& a) { return a.get().connected_server(); },
          "The server in use (credentials cut out); '' while not connected.")
      .def_prop_ro(
          "last_problem", [](const py_fleet_agent& a) { return a.get().last_problem(); },
          "Why the agent is not connected yet, in words; '' when it is.")
      .def_prop_ro(
          "converged",
          [](const py_fleet_agent& a) {
            nb::gil_scoped_release unlocked;
            return a.get().converged();
          },
          "Whether every followed module serves what its desired state names for this node.")
      .def_prop_ro(
          "last_result",
          [](const py_fleet_agent& a) -> nb::object {
            const auto r = a.get().last_result();
            return r ? from_json(fleet::to_json(*r)) : nb::none();
          },
          "The last result record published (a dict), or None.")
      .def_prop_ro(
          "stats", [](const py_fleet_agent& a) { return stats_of(a.get()); },
          "{'applied', 'duplicates', 'refused', 'retries', 'records_published', "
          "'publish_failures', 'heartbeats', 'connects', 'desired_refused', 'links_replaced'}.")
      .def(
          "metrics_text", [](const py_fleet_agent& a) { return a.get().metrics_text(); },
          "The agent's Prometheus text: versions per module, promotions, refusals, connection.")
      .def_prop_ro(
          "hot_modules", [](const py_fleet_agent& a) { return a.gate().modules(); },
          "The HotModules reconciled (its gate's).")
      .def_prop_ro("gate", &py_fleet_agent::gate_object, "The UpdateGate it decides with.")
      .def_prop_ro(
          "options", [](const py_fleet_agent& a) { return agent_settings(a.settings()); },
          "The AgentOptions it runs with (a copy; the keywords' as an AgentOptions).");
}

// FleetAgent(...): its keywords, or options=AgentOptions(...).
void bind_agent_init(nb::class_<py_fleet_agent>& c) {
  c.def(
      "__init__",
      [](py_fleet_agent* self, nb::handle hot_modules, nb::handle keys, nb::handle gate,
         std::optional<std::string> node, std::optional<std::string> node_key_file,
         std::optional<std::string> servers, std::optional<std::string> credentials,
         std::optional<std::string> ca_file, std::optional<std::string> api_prefix,
         nb::object health_probe, std::optional<std::vector<std::string>> modules,
         std::optional<std::string> cohort, std::optional<double> heartbeat_interval_s,
         std::optional<double> resync_interval_s, std::string state_file, bool persist_state,
         std::map<std::string, std::uint64_t> version_floor, bool require_expiry,
         std::optional<bool> allow_readable_key, const agent_settings* options, bool start) {
        const auto s =
            agent_settings_of(options, {{std::move(servers), std::move(credentials),
                                         std::move(ca_file), std::move(api_prefix), std::nullopt},
                                        std::move(node),
                                        std::move(node_key_file),
                                        std::move(modules),
                                        std::move(cohort),
                                        heartbeat_interval_s,
                                        resync_interval_s,
                                        allow_readable_key});
        const gate_settings private_gate{
            std::move(state_file), persist_state, std::move(version_floor),
            require_expiry,        std::nullopt,  gate_settings{}.rollback_window_s};
        auto g = gate_for(gate, hot_modules, keys, private_gate, "FleetAgent");
        new (self) py_fleet_agent(std::move(g), s, std::move(health_probe));
        if (start) self->start();
      },
      // None: not given; the defaults of AgentOptions then, and options= may stand for them.
      nb::arg("hot_modules") = nb::none(), nb::arg("public_keys") = nb::none(), nb::kw_only(),
      nb::arg("gate") = nb::none(), nb::arg("node") = nb::none(),
      nb::arg("node_key_file") = nb::none(), nb::arg("servers") = nb::none(),
      nb::arg("credentials") = nb::none(), nb::arg("ca_file") = nb::none(),
      nb::arg("api_prefix") = nb::none(), nb::arg("health_probe") = nb::none(),
      nb::arg("modules") = nb::none(), nb::arg("cohort") = nb::none(),
      nb::arg("heartbeat_interval_s") = nb::none(), nb::arg("resync_interval_s") = nb::none(),
      nb::arg("state_file") = "", nb::arg("persist_state") = true,
      nb::arg("version_floor") = std::map<std::string, std::uint64_t>{},
      nb::arg("require_expiry") = false, nb::arg("allow_readable_key") = nb::none(),
      nb::arg("options") = nb::none(), nb::arg("start") = true,
      "An agent for node `node` (enrolled with the public half of node_key_file) over "
      "`hot_modules` (a HotModule, a HotModuleGroup or a list), applying bundles signed by "
      "`public_keys`; starts unless start=False (start() returns at once also while no server "
      "answers: the agent connects and catches up by itself). health_probe: called on the "
      "heartbeat thread with the GIL, answers True/False or {'healthy': bool, 'values': {name: "
      "number}, 'detail': str}; what it raises or answers otherwise reads as unhealthy. "
      "gate: an UpdateGate shared with the node's other doors (an UpdateEndpoint), instead of "
      "hot_modules and public_keys; state_file, persist_state, version_floor, require_expiry: "
      "the private gate's replay state and policy, as UpdateEndpoint's. options: an "
      "AgentOptions instead of node, node_key_file, servers, credentials, ca_file, api_prefix, "
      "modules, cohort, heartbeat_interval_s, resync_interval_s and allow_readable_key "
      "(PreconditionError when given with any; without it node and node_key_file are needed).");
}

}  // namespace

void bind_fleet_agent(nb::module_& m) {
  bind_agent_options(m);
  nb::class_<py_fleet_agent> c(
      m, "FleetAgent",
      "A fleet node in this process (docs/fleet.md, 'What a node does'): reconciles the "
      "HotModules to the operator-signed desired state over NATS JetStream (fetch by digest, "
      "verify with `public_keys`, smoke test, promote), and sends a heartbeat signed with the "
      "node's key every heartbeat_interval_s with each module's launch counters and what "
      "`health_probe(module, version)` answers. Runs on threads of its own; a context manager "
      "(stops on exit).");
  bind_agent_init(c);
  c.def("start", &py_fleet_agent::start,
        "Starts the agent's threads. Raises PreconditionError when running already or for a bad "
        "node id or module name, IOFailure for an unreadable key or credentials file.")
      .def("stop", &py_fleet_agent::stop,
           "Stops the threads (an apply in progress finishes) and closes the connection; the "
           "modules keep serving what they have.")
      .def("close", &py_fleet_agent::stop, "stop().")
      .def(
          "__enter__",
          [](nb::handle self) {
            auto& a = nb::cast<py_fleet_agent&>(self);
            if (!a.get().running()) a.start();
            return nb::borrow(self);
          },
          "Starts the agent unless it runs already; returns it.")
      .def(
          "__exit__", [](py_fleet_agent& a, nb::handle, nb::handle, nb::handle) { a.stop(); },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "stop().");
  bind_agent_state(c);
  nb::module_::import_("atexit").attr("register")(
      nb::cpp_function([] { py_fleet_agent::stop_all(); }));
}

}  // namespace cubridge::python
