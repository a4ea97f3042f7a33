#pragma once
// `cubridge fleet dashboard --listen ADDR`: one self-contained HTML page (dashboard.html, in the
// binary) over a live view of the fleet: nodes x modules with versions in colour, each rollout's
// waves and bake clocks, the wave's health against the baseline, halts with their reasons and a
// timeline of the desired state's revisions, pushed as server-sent events. Read-only, loopback
// by default, reading the bus with the operator's credentials like the other commands.

#include <cubridge/fleet/controller.hpp>

#include <nlohmann/json.hpp>

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
  /// Most pages listening at once; more are answered 503.
  int max_listeners = 8;
};

/// Serves until SIGINT or SIGTERM; prints "dashboard at http://HOST:PORT/" once listening.
/// Returns the exit status.
int serve_dashboard(fleet::controller& control, const dashboard_options& options);

}  // namespace cubridge::tool
