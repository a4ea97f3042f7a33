#pragma once
// `cubridge fleet dashboard --listen ADDR`: one self-contained HTML page (dashboard.html, in the
// binary) over a live view of the fleet: nodes x modules with versions in colour, each rollout's
// waves and bake clocks, the wave's health against the baseline, halts with their reasons and a
// timeline of the desired state's revisions, pushed as server-sent events. Read-only, loopback
// by default, reading the bus with the operator's credentials like the other commands.

#include <cubridge/fleet/controller.hpp>

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace cubridge::tool {

/// The page (tools/fleet/dashboard.html).
[[nodiscard]] std::string_view dashboard_page() noexcept;

/// The fleet as the page shows it: `fleet status --json`'s nodes and modules, each node's health,
/// each module's wave plan, its wave's figures (canary against baseline) and its timeline.
[[nodiscard]] nlohmann::json dashboard_state(const fleet::controller& control);

struct dashboard_options {
  std::string host = "127.0.0.1";
  int port = 8090;
  /// How often the fleet is read (and a change pushed).
  std::chrono::milliseconds refresh{1000};
  /// Most pages listening at once, in all and from one client address; more are answered 503.
  int max_listeners = 8;
  int max_listeners_per_address = 2;
};

/// Makes the controller the dashboard reads through (again, after the server was lost).
using controller_factory = std::function<std::unique_ptr<fleet::controller>()>;

/// Serves until SIGINT or SIGTERM; prints "dashboard at http://HOST:PORT/" once listening. A
/// connection that sends no request within 2 s is closed, and each holds a thread of its own
/// (at most 256): /state never waits behind idle ones. A lost server is said on the page and
/// on stderr, and the dashboard connects again until it answers. Returns the exit status: 1
/// when it cannot listen (the port in use: no SO_REUSEPORT).
/// @throws as controller's constructor for the first connection.
int serve_dashboard(const controller_factory& connect, const dashboard_options& options);

}  // namespace cubridge::tool
