// The fleet's control side (fleet/controller.hpp) for a Python operator or release pipeline:
// publish, canary and wave rollouts, resume, abort, rollback, enrolment and what the nodes
// report. Each call releases the GIL while it talks to the bus (a wave rollout blocks for its
// bake times); one lock serialises the calls of several Python threads, as the C++ controller
// is used by one thread at a time.
#include "bindings.hpp"
#include "fleet_bindings.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {

void check_replicas(int replicas) {
  CUBRIDGE_EXPECTS(replicas >= 1 && replicas <= 5,
                   "fleet replicas must be 1 to 5, not " + std::to_string(replicas));
}

fleet::bus_options bus_options_of(const bus_settings& s) {
  fleet::bus_options bus;
  bus.servers = s.servers;
  bus.credentials = s.credentials;
  bus.ca_file = s.ca_file;
  bus.api_prefix = s.api_prefix;
  check_replicas(s.replicas);
  bus.replicas = s.replicas;
  return bus;
}

bus_settings bus_keywords::settings() const {
  bus_settings s;
  if (servers) s.servers = *servers;
  if (credentials) s.credentials = *credentials;
  if (ca_file) s.ca_file = *ca_file;
  if (api_prefix) s.api_prefix = *api_prefix;
  if (replicas) check_replicas(*replicas);
  s.replicas = replicas.value_or(s.replicas);
  return s;
}

std::string python_repr(nb::handle value) {
  return nb::cast<std::string>(nb::repr(value));
}

std::string repr_of(const bus_settings& bus) {
  // A URL may carry "user:password@": a repr ends up in logs.
  return "BusOptions(servers=" + python_repr(nb::cast(fleet::redact_server_list(bus.servers))) +
         ", credentials=" + python_repr(nb::cast(bus.credentials)) +
         ", ca_file=" + python_repr(nb::cast(bus.ca_file)) +
         ", api_prefix=" + python_repr(nb::cast(bus.api_prefix)) +
         ", replicas=" + std::to_string(bus.replicas) + ")";
}

std::chrono::milliseconds milliseconds_of(double seconds, const char* what) {
  CUBRIDGE_EXPECTS(std::isfinite(seconds) && seconds > 0 && seconds < 1e9,
                   std::string(what) + " must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000)));
}

nb::object from_json(const std::string& text) {
  return nb::module_::import_("json").attr("loads")(text);
}

namespace {

double posix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

nb::dict verdict_dict(const fleet::wave_verdict& v) {
  nb::dict d;
  d["failed"] = v.failed;
  d["node"] = v.node;
  d["signal"] = fleet::signal_text(v.signal, v.metric);
  d["reason"] = v.reason;
  d["canary"] = nb::cast(std::map<std::string, double>(v.canary.begin(), v.canary.end()));
  d["baseline"] = nb::cast(std::map<std::string, double>(v.baseline.begin(), v.baseline.end()));
  return d;
}

nb::dict report_dict(const fleet::rollout_report& r) {
  nb::dict d;
  d["completed"] = r.completed;
  d["version"] = r.version;
  d["desired"] = from_json(fleet::to_json(r.desired));
  d["canaries"] = nb::cast(r.canaries);
  nb::list results;
  for (const auto& result : r.results) results.append(from_json(fleet::to_json(result)));
  d["results"] = results;
  d["halt_reason"] = r.halt_reason;
  d["halt_signal"] = fleet::signal_text(r.halt_signal, r.halt_metric);
  d["halt_node"] = r.halt_node;
  d["already_desired"] = r.already_desired;
  d["last_verdict"] = verdict_dict(r.last_verdict);
  nb::list timeline;
  for (const auto& e : r.timeline) {
    nb::dict step;
    step["time"] = posix_seconds(e.time);
    step["wave"] = e.wave;
    step["what"] = std::string(to_string(e.what));
    step["detail"] = e.detail;
    timeline.append(step);
  }
  d["timeline"] = timeline;
  return d;
}

nb::dict node_dict(const fleet::node_state& n) {
  nb::dict d;
  d["node"] = n.node;
  d["labels"] = nb::cast(std::map<std::string, std::string>(n.labels.begin(), n.labels.end()));
  d["heartbeat"] = n.beat ? from_json(fleet::to_json(*n.beat)) : nb::none();
  d["age_s"] = n.age.count();
  d["live"] = n.live;
  d["restarts"] = n.restarts;
  d["clock_skew_s"] = n.clock_skew.count();
  d["problem"] = n.problem;
  return d;
}

/// The bus FleetController connects to: `bus` (a BusOptions) or the keywords it stands for,
/// never both. @throws error (errc::precondition) for both, or for replicas outside 1 to 5.
bus_settings controller_bus_of(const bus_settings* bus, const bus_keywords& keywords) {
  if (bus == nullptr) return keywords.settings();
  if (keywords.any())
    detail::throw_errc(errc::precondition, "cubridge.FleetController",
                       "FleetController takes servers, credentials=, ca_file=, api_prefix= and "
                       "replicas=, or bus=, not both");
  return *bus;
}

/// What FleetController takes besides the bus.
struct controller_settings {
  bus_settings bus;
  std::vector<public_key> operator_keys;
  double connect_timeout_s = 2;
  double request_timeout_s = 5;
  double read_deadline_s = 10;
};

/// The wave policy as Python names it (FleetController.rollout_waves's keywords).
struct wave_settings {
  std::vector<std::string> waves;
  double bake_s = 30;
  double deadline_s = 600;
  std::string cohort;
  std::optional<double> max_failure_rate;
  std::map<std::string, double> max_metrics;
  double poll_s = 0.5;
  std::string baseline_breach = "halt";
  std::uint32_t max_missed_heartbeats = 3;
};

fleet::wave_policy wave_policy_of(const wave_settings& s) {
  fleet::wave_policy p;
  p.waves = s.waves;
  p.bake = milliseconds_of(s.bake_s, "bake_s");
  p.deadline = milliseconds_of(s.deadline_s, "deadline_s");
  p.cohort = s.cohort;
  if (s.max_failure_rate) {
    CUBRIDGE_EXPECTS(
        std::isfinite(*s.max_failure_rate) && *s.max_failure_rate >= 0 && *s.max_failure_rate <= 1,
        "max_failure_rate must be a fraction from 0 to 1");
    p.limits.max_failure_rate = *s.max_failure_rate;
  }
  for (const auto& [name, limit] : s.max_metrics) {
    const auto problem = fleet::check_fleet_name(name, "a max_metrics name");
    CUBRIDGE_EXPECTS(problem.empty(), problem + " ('" + name + "')");
    CUBRIDGE_EXPECTS(std::isfinite(limit), "max_metrics['" + name + "'] must be a finite number");
    p.limits.max_metrics[name] = limit;
  }
  p.poll = milliseconds_of(s.poll_s, "poll_s");
  CUBRIDGE_EXPECTS(s.baseline_breach == "halt" || s.baseline_breach == "bake_on",
                   "baseline_breach must be 'halt' or 'bake_on'");
  p.limits.baseline_breach_halts = s.baseline_breach == "halt";
  p.max_missed_heartbeats = s.max_missed_heartbeats;
  return p;
}

class py_fleet_controller {
 public:
  explicit py_fleet_controller(const controller_settings& s) : bus_(s.bus) {
    fleet::controller_options o;
    o.bus = bus_options_of(s.bus);
    o.connect_timeout = milliseconds_of(s.connect_timeout_s, "connect_timeout_s");
    o.request_timeout = milliseconds_of(s.request_timeout_s, "request_timeout_s");
    o.read_deadline = milliseconds_of(s.read_deadline_s, "read_deadline_s");
    for (const auto& k : s.operator_keys) o.operator_keys.add(k);
    nb::gil_scoped_release unlocked;
    controller_ = std::make_unique<fleet::controller>(std::move(o));
  }

  /// `call(controller)` without the GIL, one call at a time; refused once closed.
  template <class Call>
  auto run(Call call) {
    nb::gil_scoped_release unlocked;
    std::lock_guard lock(mutex_);
    if (!controller_)
      detail::throw_errc(errc::precondition, "cubridge.FleetController",
                         "the controller is closed");
    return call(*controller_);
  }

  void close() {
    nb::gil_scoped_release unlocked;
    std::lock_guard lock(mutex_);
    controller_.reset();
  }

  [[nodiscard]] const bus_settings& bus() const noexcept { return bus_; }

 private:
  bus_settings bus_;  // as given, for FleetController.bus
  std::mutex mutex_;
  std::unique_ptr<fleet::controller> controller_;
};

using controller_ref = fleet::controller&;

// The calls that start a rollout: publish, rollout (canaries) and rollout_waves.
void bind_controller_rollouts(nb::class_<py_fleet_controller>& c) {
  c.def(
       "publish",
       [](py_fleet_controller& self, nb::handle bundle, const secret_key& key) {
         const auto bytes = image_bytes(bundle);
         return report_dict(self.run([&](controller_ref c) { return c.publish(bytes, key); }));
       },
       nb::arg("bundle"), nb::arg("operator_key"),
       "Stores the signed bundle (bytes or a path) and makes it every node's desired version at "
       "once. Returns the rollout report. Raises BundleError when it does not verify, FleetError "
       "(reason 'older_version', 'conflict', 'oversized', ...) otherwise.")
      .def(
          "rollout",
          [](py_fleet_controller& self, nb::handle bundle, const secret_key& key,
             std::size_t canaries, std::size_t successes, std::string cohort, double window_s) {
            const auto bytes = image_bytes(bundle);
            fleet::canary_policy p;
            p.canaries = canaries;
            p.successes = successes;
            p.cohort = std::move(cohort);
            p.window = milliseconds_of(window_s, "window_s");
            return report_dict(
                self.run([&](controller_ref c) { return c.rollout(bytes, p, key); }));
          },
          nb::arg("bundle"), nb::arg("operator_key"), nb::kw_only(), nb::arg("canaries") = 1,
          nb::arg("successes") = 0, nb::arg("cohort") = "", nb::arg("window_s") = 60.0,
          "The canary rollout of `cubridge fleet publish --canary N`: the candidate to N canaries, "
          "then, when `successes` (0: N) applied it within window_s, to every node; else halted. "
          "Returns the rollout report (report['completed'], report['halt_reason']).")
      .def(
          "rollout_waves",
          [](py_fleet_controller& self, nb::handle bundle, const secret_key& key,
             std::vector<std::string> waves, double bake_s, double deadline_s, std::string cohort,
             std::optional<double> max_failure_rate, std::map<std::string, double> max_metrics,
             double poll_s, std::string baseline_breach, std::uint32_t max_missed_heartbeats) {
            const auto bytes = image_bytes(bundle);
            const auto p = wave_policy_of({std::move(waves), bake_s, deadline_s, std::move(cohort),
                                           max_failure_rate, std::move(max_metrics), poll_s,
                                           std::move(baseline_breach), max_missed_heartbeats});
            return report_dict(
                self.run([&](controller_ref c) { return c.rollout_waves(bytes, p, key); }));
          },
          nb::arg("bundle"), nb::arg("operator_key"), nb::kw_only(), nb::arg("waves"),
          nb::arg("bake_s") = 30.0, nb::arg("deadline_s") = 600.0, nb::arg("cohort") = "",
          nb::arg("max_failure_rate") = nb::none(),
          nb::arg("max_metrics") = std::map<std::string, double>{}, nb::arg("poll_s") = 0.5,
          nb::arg("baseline_breach") = "halt", nb::arg("max_missed_heartbeats") = 3u,
          "The wave rollout of `cubridge fleet publish --waves 1,10%,50% --bake 30s`: wave after "
          "wave (sizes 'N' or 'P%', cumulative; '100%' added last), each done when its nodes "
          "applied the bundle and stayed healthy for bake_s against the nodes still on the old "
          "version (their probes, sticky errors, max_failure_rate of launches, max_metrics "
          "{name: most}); a breach or a wave past deadline_s halts and rolls the waves back. A "
          "node of the wave that goes silent for max_missed_heartbeats intervals, restarts or "
          "leaves the candidate halts it too; a baseline that breaches on its own halts for "
          "review unless baseline_breach='bake_on'. "
          "Blocks until it completes or halts (the plan is desired state: a process killed "
          "meanwhile loses nothing, resume() carries on). Returns the rollout report: "
          "'completed', 'halt_signal', 'halt_node', 'halt_reason', 'last_verdict', 'timeline'.");
}

// The calls that act on a module's rollout once started: resume, abort and rollback.
void bind_controller_recovery(nb::class_<py_fleet_controller>& c) {
  c.def(
       "resume",
       [](py_fleet_controller& self, const std::string& module, const secret_key& key) {
         return report_dict(self.run([&](controller_ref c) { return c.resume(module, key); }));
       },
       nb::arg("module"), nb::arg("operator_key"),
       "Carries on the module's wave rollout: a halted one from the wave that failed, one "
       "under way from its wave. Raises FleetError (reason 'invalid_state') when there is none.")
      .def(
          "abort",
          [](py_fleet_controller& self, const std::string& module, const secret_key& key) {
            return from_json(
                fleet::to_json(self.run([&](controller_ref c) { return c.abort(module, key); })));
          },
          nb::arg("module"), nb::arg("operator_key"),
          "Ends the module's wave rollout (every node back on the stable version); returns the "
          "desired state written. Raises FleetError (reason 'invalid_state') when there is none.")
      .def(
          "rollback",
          [](py_fleet_controller& self, const std::string& module, const secret_key& key,
             std::uint64_t to_version) {
            return from_json(fleet::to_json(
                self.run([&](controller_ref c) { return c.rollback(module, to_version, key); })));
          },
          nb::arg("module"), nb::arg("operator_key"), nb::kw_only(), nb::arg("to_version") = 0,
          "Makes an earlier stable version desired again (0: the one before the current one); "
          "returns the desired state written.");
}

void bind_controller_reads(nb::class_<py_fleet_controller>& c) {
  c.def(
       "enroll",
       [](py_fleet_controller& self, const std::string& node, const public_key& node_key,
          const std::map<std::string, std::string>& labels, const secret_key& key) {
         const std::map<std::string, std::string, std::less<>> l(labels.begin(), labels.end());
         self.run([&](controller_ref c) {
           c.enroll(node, node_key, l, key);
           return 0;
         });
       },
       nb::arg("node"), nb::arg("node_key"), nb::kw_only(),
       nb::arg("labels") = std::map<std::string, std::string>{}, nb::arg("operator_key"),
       "Enrols (or re-enrols) a node with its public key and labels ({'cohort': 'eu'}); only "
       "records signed by an enrolled node's key are believed.")
      .def(
          "nodes",
          [](py_fleet_controller& self) {
            const auto nodes = self.run([](controller_ref c) { return c.nodes(); });
            nb::list out;
            for (const auto& n : nodes) out.append(node_dict(n));
            return out;
          },
          "Every enrolled node: {'node', 'labels', 'heartbeat' (its last verified one, or None), "
          "'age_s', 'live', 'problem'}.")
      .def(
          "desired",
          [](py_fleet_controller& self, const std::string& module) -> nb::object {
            const auto entry = self.run([&](controller_ref c) { return c.desired(module); });
            return entry ? from_json(fleet::to_json(entry->state)) : nb::none();
          },
          nb::arg("module"), "The module's desired state as a dict, or None when none was written.")
      .def(
          "desired_history",
          [](py_fleet_controller& self, const std::string& module) {
            const auto states =
                self.run([&](controller_ref c) { return c.desired_history(module); });
            nb::list out;
            for (const auto& s : states) out.append(from_json(fleet::to_json(s)));
            return out;
          },
          nb::arg("module"),
          "Every desired state of the module the bucket still holds, oldest first: its timeline.")
      .def(
          "modules",
          [](py_fleet_controller& self) {
            const auto entries = self.run([](controller_ref c) { return c.modules(); });
            nb::list out;
            for (const auto& e : entries) out.append(from_json(fleet::to_json(e.state)));
            return out;
          },
          "Every module's desired state, by name.")
      .def_prop_ro(
          "connected_server",
          [](py_fleet_controller& self) {
            return self.run([](controller_ref c) { return c.connected_server(); });
          },
          "The server in use, with any credentials cut out.")
      .def_prop_ro(
          "open_bus",
          [](py_fleet_controller& self) {
            return self.run([](controller_ref c) { return c.open_bus(); });
          },
          "True when the server took a connection without credentials (a demo only).")
      .def_prop_ro(
          "warnings",
          [](py_fleet_controller& self) {
            return self.run([](controller_ref c) { return c.warnings(); });
          },
          "Streams or buckets found configured otherwise than docs/fleet.md's.")
      .def_prop_ro(
          "bus", [](const py_fleet_controller& self) { return bus_settings(self.bus()); },
          "The BusOptions it was built with (a copy; the keywords' as a BusOptions).");
}

void bind_bus_options(nb::module_& m) {
  nb::class_<bus_settings>(
      m, "BusOptions",
      "The bus a side of the fleet talks over (fleet::bus_options), for FleetController(bus=...) "
      "and AgentOptions(bus=...). Its attributes can be set; replicas is checked when set.")
      .def(
          "__init__",
          [](bus_settings* self, std::string servers, std::string credentials, std::string ca_file,
             std::string api_prefix, int replicas) {
            check_replicas(replicas);
            new (self) bus_settings{std::move(servers), std::move(credentials), std::move(ca_file),
                                    std::move(api_prefix), replicas};
          },
          nb::arg("servers") = "nats://127.0.0.1:4222", nb::kw_only(), nb::arg("credentials") = "",
          nb::arg("ca_file") = "", nb::arg("api_prefix") = "", nb::arg("replicas") = 1,
          "`servers`: comma-separated nats:// or tls:// URLs, tried in order; credentials: the "
          "credentials file of `cubridge fleet init` ('' for an open server, a demo only); "
          "ca_file: the fleet's CA (PEM; TLS then); api_prefix: the JetStream API prefix ('': "
          "the credentials file's, else '$JS.API'); replicas: of the streams and the bucket "
          "this side creates, 1 to 5 (PreconditionError otherwise).")
      .def_rw("servers", &bus_settings::servers,
              "Comma-separated nats:// or tls:// URLs, tried in order.")
      .def_rw("credentials", &bus_settings::credentials,
              "The credentials file ('': none, an open server).")
      .def_rw("ca_file", &bus_settings::ca_file,
              "The CA certificate (PEM) of the servers' certificates ('': none).")
      .def_rw("api_prefix", &bus_settings::api_prefix,
              "The JetStream API prefix ('': the credentials file's, else '$JS.API').")
      .def_prop_rw(
          "replicas", [](const bus_settings& b) { return b.replicas; },
          [](bus_settings& b, int replicas) {
            check_replicas(replicas);
            b.replicas = replicas;
          },
          "Replicas of the streams and the bucket created, 1 to 5 (3 in a 3-server cluster).")
      .def("__repr__", &repr_of);
}

}  // namespace

void bind_fleet_controller(nb::module_& m) {
  bind_bus_options(m);
  nb::class_<py_fleet_controller> c(
      m, "FleetController",
      "The fleet's control side (docs/fleet.md): what `cubridge fleet publish | resume | abort | "
      "rollback | enroll | status` do, from Python. Connects once (FleetError, reason "
      "'unreachable' or 'refused', when it cannot); a context manager (closes on exit). Calls "
      "release the GIL; calls from several threads are made one at a time.");
  c.def(
      "__init__",
      [](py_fleet_controller* self, std::optional<std::string> servers, const bus_settings* bus,
         std::vector<public_key> operator_keys, std::optional<std::string> credentials,
         std::optional<std::string> ca_file, std::optional<std::string> api_prefix,
         std::optional<int> replicas, double connect_timeout_s, double request_timeout_s,
         double read_deadline_s) {
        const bus_keywords keywords{std::move(servers), std::move(credentials), std::move(ca_file),
                                    std::move(api_prefix), replicas};
        const controller_settings s{controller_bus_of(bus, keywords), std::move(operator_keys),
                                    connect_timeout_s, request_timeout_s, read_deadline_s};
        new (self) py_fleet_controller(s);
      },
      // None: not given; BusOptions' defaults then, and bus= may stand for them.
      nb::arg("servers") = nb::none(), nb::kw_only(), nb::arg("bus") = nb::none(),
      nb::arg("operator_keys") = std::vector<public_key>{}, nb::arg("credentials") = nb::none(),
      nb::arg("ca_file") = nb::none(), nb::arg("api_prefix") = nb::none(),
      nb::arg("replicas") = nb::none(), nb::arg("connect_timeout_s") = 2.0,
      nb::arg("request_timeout_s") = 5.0, nb::arg("read_deadline_s") = 10.0,
      "Connects to `servers` (comma-separated nats:// or tls:// URLs, tried in order; "
      "'nats://127.0.0.1:4222' when not given) with the credentials file of `cubridge fleet "
      "init` and the fleet's CA; desired states are believed when signed by one of "
      "operator_keys or by the key a call signs with. bus: a BusOptions instead of servers, "
      "credentials, ca_file, api_prefix and replicas (PreconditionError when given with any).");
  bind_controller_rollouts(c);
  bind_controller_recovery(c);
  bind_controller_reads(c);
  c.def("close", &py_fleet_controller::close, "Closes the connection; later calls raise.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__", [](py_fleet_controller& c, nb::handle, nb::handle, nb::handle) { c.close(); },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none());
}

}  // namespace cubridge::python
