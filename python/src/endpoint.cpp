// The update endpoint (update/update_endpoint.hpp) embeddable in a Python service: an HTTP
// endpoint on threads of its own that takes signed bundles and promotes them into HotModules
// through a hot_module_sink. The endpoint's threads never touch Python: the sink works on the
// C++ hot modules, whose Python objects the endpoint keeps alive.
#include "bindings.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

/// What UpdateEndpoint takes besides its gate (the update_endpoint_options a Python service
/// sets; the rest keep their C++ defaults).
struct endpoint_settings {
  std::string host;
  std::uint16_t port = 0;
  std::size_t threads = 4;
  std::size_t max_body_bytes = std::size_t{64} << 20;
  bool serve_metrics = false;
  std::string tls_certificate, tls_private_key;
};

update_endpoint_options options_of(const endpoint_settings& s) {
  update_endpoint_options o;
  o.bind_address = s.host;
  o.port = s.port;
  o.threads = s.threads;
  o.max_body_bytes = s.max_body_bytes;
  o.max_buffered_body_bytes = std::max(o.max_buffered_body_bytes, s.max_body_bytes);
  o.serve_metrics = s.serve_metrics;
  o.tls_certificate = s.tls_certificate;
  o.tls_private_key = s.tls_private_key;
  return o;
}

class py_update_endpoint {
 public:
  /// An endpoint in front of `gate` (an UpdateGate, shared or private).
  py_update_endpoint(nb::object gate, const endpoint_settings& settings, bool start_now)
      : gate_(std::move(gate)),
        endpoint_(std::make_unique<update_endpoint>(this->gate().shared(), options_of(settings))) {
    if (start_now) start();
  }
  py_update_endpoint(const py_update_endpoint&) = delete;
  py_update_endpoint& operator=(const py_update_endpoint&) = delete;
  ~py_update_endpoint() { stop(); }

  /// Serves `hot_module` too, through the gate (every door of it).
  void add(nb::handle hot_module) { gate().add(hot_module); }

  void start() {
    nb::gil_scoped_release unlocked;
    endpoint_->start();
  }
  void stop() {
    nb::gil_scoped_release unlocked;
    endpoint_->stop();
  }
  [[nodiscard]] const update_endpoint& get() const { return *endpoint_; }
  [[nodiscard]] py_update_gate& gate() const { return nb::cast<py_update_gate&>(gate_); }
  [[nodiscard]] nb::object gate_object() const { return gate_; }

 private:
  nb::object gate_;  // the UpdateGate: declared first, released after the endpoint stopped
  std::unique_ptr<update_endpoint> endpoint_;
};

nb::dict stats_of(const update_endpoint& e) {
  const auto s = e.stats();
  nb::dict d;
  d["applied"] = s.applied;
  d["refused"] = s.refused;
  d["rolled_back"] = s.rolled_back;
  d["connections_refused"] = s.connections_refused;
  d["open_connections"] = s.open_connections;
  return d;
}

// The endpoint's running state, as properties.
void bind_endpoint_state(nb::class_<py_update_endpoint>& c) {
  c.def_prop_ro(
       "running", [](const py_update_endpoint& e) { return e.get().running(); },
       "True between start() and stop().")
      .def_prop_ro(
          "port", [](const py_update_endpoint& e) { return e.get().port(); },
          "The bound port; 0 when not running.")
      .def_prop_ro(
          "url", [](const py_update_endpoint& e) { return e.get().url(); },
          "'http://127.0.0.1:PORT' (https with TLS); '' when not running.")
      .def_prop_ro(
          "stats", [](const py_update_endpoint& e) { return stats_of(e.get()); },
          "{'applied', 'refused', 'rolled_back', 'connections_refused', 'open_connections'}.")
      .def_prop_ro(
          "hot_modules", [](const py_update_endpoint& e) { return e.gate().modules(); },
          "The HotModules served (its gate's).")
      .def_prop_ro("gate", &py_update_endpoint::gate_object, "The UpdateGate it decides with.");
}

}  // namespace

void bind_update_endpoint(nb::module_& m) {
  nb::class_<py_update_endpoint> c(
      m, "UpdateEndpoint",
      "The update endpoint (docs/update-endpoint.md) in this process: PUT /v1/modules/NAME "
      "with a signed bundle stages and promotes it into the HotModule NAME; POST "
      "/v1/modules/NAME/rollback rolls back; GET /v1/modules reports. Only bundles signed by "
      "`public_keys` are applied, each version at most once. Runs on threads of its own; a "
      "context manager (stops on exit).");
  c.def(
       "__init__",
       [](py_update_endpoint* self, nb::handle hot_modules, nb::handle keys, nb::handle gate,
          std::string host, std::uint16_t port, bool start, std::size_t threads,
          std::size_t max_body_bytes, std::string state_file, bool persist_state,
          std::map<std::string, std::uint64_t> version_floor, bool require_expiry,
          std::optional<double> max_bundle_age_s, double rollback_window_s, bool serve_metrics,
          std::string tls_certificate, std::string tls_private_key) {
         const gate_settings private_gate{std::move(state_file),    persist_state,
                                          std::move(version_floor), require_expiry,
                                          max_bundle_age_s,         rollback_window_s};
         auto g = gate_for(gate, hot_modules, keys, private_gate, "UpdateEndpoint");
         const endpoint_settings settings{std::move(host),
                                          port,
                                          threads,
                                          max_body_bytes,
                                          serve_metrics,
                                          std::move(tls_certificate),
                                          std::move(tls_private_key)};
         new (self) py_update_endpoint(std::move(g), settings, start);
       },
       nb::arg("hot_modules") = nb::none(), nb::arg("public_keys") = nb::none(), nb::kw_only(),
       nb::arg("gate") = nb::none(), nb::arg("host") = "127.0.0.1", nb::arg("port") = 0,
       nb::arg("start") = true, nb::arg("threads") = 4,
       nb::arg("max_body_bytes") = std::size_t{64} << 20, nb::arg("state_file") = "",
       nb::arg("persist_state") = true,
       nb::arg("version_floor") = std::map<std::string, std::uint64_t>{},
       nb::arg("require_expiry") = false, nb::arg("max_bundle_age_s") = nb::none(),
       nb::arg("rollback_window_s") = 300.0, nb::arg("serve_metrics") = false,
       nb::arg("tls_certificate") = "", nb::arg("tls_private_key") = "",
       "An endpoint in front of `gate` (an UpdateGate shared with the node's other doors), or "
       "of a private gate over `hot_modules` (a HotModule or a list of them; each serves "
       "updates under its name, from its label on) accepting bundles signed by "
       "`public_keys`. Binds `host`:`port` (0: a free port, see .port) and starts unless "
       "start=False. The private gate's state_file: the replay state kept across restarts; "
       "without one it is kept in $CUBRIDGE_STATE_DIR (else $XDG_STATE_HOME/cubridge, else "
       "~/.local/state/cubridge)/update-state.json, locked while the gate lives, unless "
       "persist_state=False (memory only: tests, demos); version_floor: {name: version} "
       "refused as replays (these belong to UpdateGate when gate= is given). TLS with both "
       "tls_ files. Raises IOFailure when the address cannot be bound or the state file is "
       "another gate's.")
      .def("add", &py_update_endpoint::add, nb::arg("hot_module"),
           "Serves one more HotModule (also while running).")
      .def("start", &py_update_endpoint::start,
           "Binds and starts serving. Raises PreconditionError when running already.")
      .def("stop", &py_update_endpoint::stop,
           "Stops accepting, lets a request being applied finish, joins the threads.")
      .def("close", &py_update_endpoint::stop, "stop().")
      .def(
          "__enter__",
          [](nb::handle self) {
            auto& e = nb::cast<py_update_endpoint&>(self);
            if (!e.get().running()) e.start();
            return nb::borrow(self);
          },
          "Starts the endpoint unless it runs already; returns it.")
      .def(
          "__exit__", [](py_update_endpoint& e, nb::handle, nb::handle, nb::handle) { e.stop(); },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "stop().");
  bind_endpoint_state(c);
}

}  // namespace cubridge::python
