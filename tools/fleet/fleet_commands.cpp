// `cubridge fleet publish | rollback | enroll`, and the registration of the fleet commands
// (status and watch: fleet_status.cpp). Bundles are made as `cubridge push` makes them
// (tools/update/signing.hpp): a .bundle as is, a .cu compiled for the fleet's GPU, a cubin or
// fatbin signed. Every write of the desired state or the registry is signed with --key.
#include "fleet/fleet_commands.hpp"

#include "exit_codes.hpp"
#include "fleet/fleet_dashboard.hpp"
#include "fleet/fleet_status.hpp"
#include "update/arguments.hpp"
#include "update/signing.hpp"

#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>

namespace cubridge::tool {
namespace {

using detail::printable;
using fleet::controller;

constexpr const char* readable_key_help =
    "Sign with a secret key file that group or others may read (refused otherwise)";

// The GPU every live node reports, when they agree on one; else sm_90.
std::string fleet_target(const controller& control) {
  std::set<std::string> gpus;
  for (const auto& node : control.nodes())
    if (node.live && node.beat && !node.beat->gpu.empty()) gpus.insert(node.beat->gpu);
  if (gpus.size() == 1 && parse_compute_capability(*gpus.begin())) return *gpus.begin();
  return "sm_90";
}

// The bundle to publish: a .bundle as is, else the file (compiled when .cu) signed with `key`.
std::vector<std::byte> make_bundle(const controller& control, const std::filesystem::path& file,
                                   signing_request request, const secret_key& key) {
  if (file.extension() == ".bundle") return read_input(file, max_input_bytes, "bundle").bytes;
  if (request.version == 0)
    throw usage_error("publishing " + file.string() +
                      " signs it first: give --version (or publish a .bundle)");
  const auto input = read_input(file, max_input_bytes, "payload");
  bundle_manifest manifest;
  if (file.extension() != ".cu") return sign_payload(request, input.bytes, false, key, &manifest);
  if (request.target.empty()) request.target = fleet_target(control);
  const auto target = parse_compute_capability(request.target);
  if (!target)
    throw usage_error("--target '" + printable(request.target) +
                      "' is not a GPU architecture sm_NN[a|f] (e.g. sm_90)");
  build_options options;
  options.compile.include_paths.push_back(file.parent_path().empty() ? "." : file.parent_path());
  const auto compiled = build_machine_code(source_kind::cuda_source, input.bytes,
                                           file.filename().string(), *target, options);
  std::cout << "compiled " << file.string() << " for " << request.target << " (" << compiled.size()
            << " bytes)\n";
  return sign_payload(request, compiled, false, key, &manifest);
}

void print_result(const fleet::result_record& r) {
  std::cout << "  " << r.node << " " << to_string(r.outcome) << " v" << r.version
            << (r.reason.empty() ? "" : " " + r.reason) << (r.detail.empty() ? "" : ": " + r.detail)
            << "\n";
}

// Seconds as given on the command line: a finite positive number (CLI11's range check lets a
// NaN through).
std::chrono::milliseconds seconds_of(double seconds, const char* option) {
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 86400)
    throw usage_error(std::string(option) +
                      " must be a duration above 0 and at most 1d (e.g. 500ms, 90s, 5m)");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// --max-metric NAME<=X.
std::pair<std::string, double> parse_metric_limit(const std::string& text) {
  const auto at = text.find("<=");
  double limit = 0;
  const auto number = at == std::string::npos ? std::string() : text.substr(at + 2);
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), limit);
  if (at == std::string::npos || number.empty() || ec != std::errc{} ||
      end != number.data() + number.size() || !std::isfinite(limit))
    throw usage_error("--max-metric '" + printable(text) + "' is not NAME<=NUMBER");
  const auto name = text.substr(0, at);
  if (const auto problem = fleet::check_fleet_name(name, "metric name"); !problem.empty())
    throw usage_error("--max-metric: " + problem);
  return {name, limit};
}

}  // namespace

fleet_commands::fleet_commands(CLI::App& app) {
  fleet_ = app.add_subcommand("fleet", "Roll modules out to a fleet over NATS JetStream");
  fleet_->require_subcommand(1);
  add_publish();
  add_state_commands();
  add_views();
  add_enroll();
  init_ = add_fleet_init_command(*fleet_, init_options_);
}

void fleet_commands::bus_options(CLI::App* command) {
  command
      ->add_option("--server", bus_.server,
                   "The NATS server(s), comma-separated: nats://HOST:PORT or tls://HOST:PORT "
                   "(default nats://127.0.0.1:4222)")
      ->envname("CUBRIDGE_FLEET_SERVER");
  command
      ->add_option("--credentials", bus_.credentials,
                   "The operator's credentials file (cubridge fleet init writes it)")
      ->envname("CUBRIDGE_FLEET_CREDENTIALS");
  command->add_option("--ca", bus_.ca, "The CA certificate the servers' certificates verify with")
      ->envname("CUBRIDGE_FLEET_CA");
  command
      ->add_option("--profile", bus_.profile,
                   "A profile naming the server, credentials, CA and replicas (cubridge fleet "
                   "init writes operator.profile); the options above override it")
      ->envname("CUBRIDGE_FLEET_PROFILE");
  command->add_option("--replicas", bus_.replicas, "Replicas of what this command creates")
      ->check(CLI::Range(1, 5));
  command->add_option("--trusted-key", bus_.trusted_keys,
                      "An operator public key whose desired state is believed (repeatable)");
}

void fleet_commands::add_publish() {
  auto& p = publish_args_;
  publish_ = fleet_->add_subcommand("publish", "Sign and publish a module to the fleet");
  bus_options(publish_);
  publish_->add_option("file", p.file, "A .bundle (sent as is), or a .cu, cubin or fatbin")
      ->required();
  publish_->add_option("--key", p.key, "The operator's secret key: signs the desired state")
      ->envname("CUBRIDGE_FLEET_KEY")
      ->required();
  publish_->add_option("--name", p.name, "Module name (default: the file's stem)");
  publish_->add_option("--version", p.version, "Module version when signing")
      ->check(version_validator());
  publish_->add_option("--target", p.target,
                       "GPU to compile a .cu for (default: the nodes' common GPU, else sm_90)");
  auto* canary = publish_
                     ->add_option("--canary", p.canary,
                                  "Canaries first: the first N live nodes by id that follow the "
                                  "module and can run it")
                     ->check(CLI::Range(1, 10000));
  publish_->add_option("--successes", p.successes, "Applied canary results needed (default N)")
      ->check(CLI::Range(1, 10000))
      ->needs(canary);
  publish_->add_option("--cohort", p.cohort, "Canaries or waves only from nodes labelled cohort=C");
  publish_->add_option("--window", p.window_s, "How long to wait for results (default 60s)")
      ->transform(duration_transform());
  publish_
      ->add_option("--publish-timeout", p.publish_timeout_s,
                   "How long storing the bundle may take (default 5s plus 1s per MiB)")
      ->transform(duration_transform());
  auto* waves = publish_
                    ->add_option("--waves", p.waves,
                                 "Progressive delivery: waves of N nodes or P% of them, e.g. "
                                 "1,10%,50%,100% (each bakes before the next)")
                    ->delimiter(',')
                    ->excludes(canary);
  publish_->add_option("--bake", p.bake_s, "How long each wave stays healthy first (default 30s)")
      ->transform(duration_transform())
      ->needs(waves);
  publish_
      ->add_option("--wave-deadline", p.wave_deadline_s,
                   "How long one wave may take before the rollout halts (default 10m)")
      ->transform(duration_transform())
      ->needs(waves);
  publish_
      ->add_option("--max-failure-rate", p.max_failure_rate,
                   "Launch failures per launch a wave may have, 0 to 1 (compared with the "
                   "nodes on the old version)")
      ->check(CLI::Range(0.0, 1.0))
      ->needs(waves);
  publish_
      ->add_option("--max-metric", p.max_metrics,
                   "NAME<=X: the most the health probe's value NAME may be on a wave's "
                   "nodes on average (repeatable)")
      ->needs(waves);
  publish_
      ->add_option("--baseline-breach", p.baseline_breach,
                   "What a baseline that breaches a limit on its own does: halt (for review, "
                   "the default) or bake-on (taken for a fleet-wide dip)")
      ->check(CLI::IsMember({"halt", "bake-on"}))
      ->needs(waves);
  publish_
      ->add_option("--max-missed-heartbeats", p.max_missed_heartbeats,
                   "Heartbeat intervals a wave's node may stay silent in its bake before it "
                   "counts as lost (default 3)")
      ->check(CLI::Range(1, 100))
      ->needs(waves);
  publish_->add_flag("--wait", p.wait, "Wait for every live node's result");
  publish_->add_flag("--allow-readable-key", p.allow_readable_key, readable_key_help);
}

// rollback, resume, abort: changes of a module's desired state besides publishing.
void fleet_commands::add_state_commands() {
  rollback_ = fleet_->add_subcommand("rollback", "Make an earlier version desired again (signed)");
  bus_options(rollback_);
  rollback_->add_option("module", rollback_args_.module, "The module")->required();
  rollback_->add_option("--key", rollback_args_.key, "The operator's secret key")
      ->envname("CUBRIDGE_FLEET_KEY")
      ->required();
  rollback_
      ->add_option("--to-version", rollback_args_.to_version,
                   "The version to go back to (default: the stable one before the current)")
      ->check(version_validator());
  rollback_->add_flag("--allow-readable-key", rollback_args_.allow_readable_key, readable_key_help);

  resume_ = fleet_->add_subcommand("resume", "Carry on a halted or interrupted wave rollout");
  bus_options(resume_);
  resume_->add_option("module", rollback_args_.module, "The module")->required();
  resume_->add_option("--key", rollback_args_.key, "The operator's secret key")
      ->envname("CUBRIDGE_FLEET_KEY")
      ->required();
  resume_->add_flag("--allow-readable-key", rollback_args_.allow_readable_key, readable_key_help);
  abort_ =
      fleet_->add_subcommand("abort", "End a wave rollout: every node back on the stable version");
  bus_options(abort_);
  abort_->add_option("module", rollback_args_.module, "The module")->required();
  abort_->add_option("--key", rollback_args_.key, "The operator's secret key")
      ->envname("CUBRIDGE_FLEET_KEY")
      ->required();
  abort_->add_flag("--allow-readable-key", rollback_args_.allow_readable_key, readable_key_help);
}

// status, watch, dashboard: reading the fleet.
void fleet_commands::add_views() {
  status_ = fleet_->add_subcommand("status", "Which node runs what, and each module's rollout");
  bus_options(status_);
  status_->add_flag("--json", status_json_, "Print the status as JSON");
  status_
      ->add_option("--key", status_key_, "The operator's secret key (its public half is trusted)")
      ->envname("CUBRIDGE_FLEET_KEY");

  watch_ = fleet_->add_subcommand("watch", "A live table of the nodes, until interrupted");
  bus_options(watch_);
  watch_->add_flag("--once", watch_once_, "Print the table once and exit");
  watch_->add_option("--key", status_key_, "The operator's secret key (its public half is trusted)")
      ->envname("CUBRIDGE_FLEET_KEY");

  dashboard_ = fleet_->add_subcommand(
      "dashboard", "A live page of the fleet: nodes x modules, waves, health, halts, timeline");
  bus_options(dashboard_);
  dashboard_->add_option("--listen", dashboard_listen_,
                         "HOST:PORT to serve the page on (default 127.0.0.1:8090: this machine "
                         "only; the page is read-only)");
  dashboard_
      ->add_option("--key", status_key_, "The operator's secret key (its public half is trusted)")
      ->envname("CUBRIDGE_FLEET_KEY");
}

void fleet_commands::add_enroll() {
  auto& e = enroll_args_;
  enroll_ = fleet_->add_subcommand("enroll", "Enrol a node: its id, public key and labels");
  bus_options(enroll_);
  enroll_->add_option("node", e.node, "The node's id")->required();
  enroll_->add_option("--node-key", e.node_key, "The node's public key file")->required();
  enroll_->add_option("--key", e.key, "The operator's secret key: signs the registry")
      ->envname("CUBRIDGE_FLEET_KEY")
      ->required();
  enroll_->add_option("--label", e.labels, "A label NAME=VALUE (repeatable), e.g. cohort=a");
  enroll_->add_flag("--allow-readable-key", e.allow_readable_key, readable_key_help);
}

bool fleet_commands::parsed() const {
  return fleet_->parsed();
}

fleet::controller_options fleet_commands::options(const std::string& signing_key,
                                                  bool allow_readable_key) const {
  fleet::controller_options o;
  // The profile first, then what the command line or the environment gave over it.
  if (!bus_.profile.empty()) o.bus = fleet::read_bus_profile(bus_.profile);
  if (!bus_.server.empty()) o.bus.servers = bus_.server;
  if (!bus_.credentials.empty()) o.bus.credentials = bus_.credentials;
  if (!bus_.ca.empty()) o.bus.ca_file = bus_.ca;
  if (bus_.replicas != 0) o.bus.replicas = bus_.replicas;
  for (const auto& file : bus_.trusted_keys) o.operator_keys.add(read_public_key_file(file));
  try {
    (void)fleet::parse_server_list(o.bus.servers);
  } catch (const error& e) {
    throw usage_error(std::string("--server: ") + e.what());
  }
  if (!signing_key.empty())
    o.operator_keys.add(read_signing_key(signing_key, allow_readable_key).key.public_key());
  return o;
}

int fleet_commands::run() const noexcept {
  try {
    if (publish_->parsed()) return publish();
    if (status_->parsed()) return status();
    if (rollback_->parsed()) return rollback();
    if (resume_->parsed()) return resume_or_abort(true);
    if (abort_->parsed()) return resume_or_abort(false);
    if (watch_->parsed()) return watch();
    if (dashboard_->parsed()) return dashboard();
    if (enroll_->parsed()) return enroll();
    if (init_->parsed()) return run_fleet_init(init_options_);
  } catch (const usage_error& e) {
    std::cerr << "cubridge: " << fleet::redact_url(e.what()) << "\n";
    return exit_usage;
  } catch (const error& e) {
    std::cerr << "cubridge: " << fleet::redact_url(e.what()) << "\n";
    return e.is(fleet_errc::unreachable) ? exit_unreachable : exit_failure;
  } catch (const std::exception& e) {
    std::cerr << "cubridge: " << fleet::redact_url(e.what()) << "\n";
    return exit_failure;
  }
  return exit_usage;
}

int fleet_commands::publish() const {
  const auto& a = publish_args_;
  if (a.successes > a.canary)
    throw usage_error("--successes " + std::to_string(a.successes) + " is over --canary " +
                      std::to_string(a.canary));
  if (!a.cohort.empty() && a.canary == 0 && a.waves.empty())
    throw usage_error("--cohort chooses canaries or waves: give --canary N or --waves");
  const auto window = seconds_of(a.window_s, "--window");
  auto o = options(a.key, a.allow_readable_key);
  if (a.publish_timeout_s != 0)
    o.publish_timeout = seconds_of(a.publish_timeout_s, "--publish-timeout");
  const auto key = read_signing_key(a.key, a.allow_readable_key);
  controller control(std::move(o));
  const std::filesystem::path file = a.file;
  const auto bundle = make_bundle(
      control, file, {file, a.key, a.name, a.version, a.target, std::nullopt, a.allow_readable_key},
      key.key);
  if (!a.waves.empty()) {
    fleet::wave_policy policy;
    try {
      policy.waves = fleet::checked_waves(a.waves);
    } catch (const error& e) {
      throw usage_error(std::string("--waves: ") + e.what());
    }
    policy.bake = a.bake_s == 0 ? std::chrono::milliseconds(0) : seconds_of(a.bake_s, "--bake");
    policy.deadline = seconds_of(a.wave_deadline_s, "--wave-deadline");
    policy.cohort = a.cohort;
    policy.limits.max_failure_rate = a.max_failure_rate;
    for (const auto& limit : a.max_metrics)
      policy.limits.max_metrics.insert(parse_metric_limit(limit));
    policy.limits.baseline_breach_halts = a.baseline_breach != "bake-on";
    policy.max_missed_heartbeats = a.max_missed_heartbeats;
    return wave_outcome(control.rollout_waves(bundle, policy, key.key));
  }
  if (a.canary) {
    const auto report = control.rollout(bundle, {a.canary, a.successes, a.cohort, window}, key.key);
    const auto& m = report.desired;
    std::cout << "canaries of '" << m.module << "' v" << report.version << ":";
    for (const auto& node : report.canaries) std::cout << " " << node;
    std::cout << "\n";
    for (const auto& r : report.results) print_result(r);
    if (report.completed) {
      std::cout << "'" << m.module << "' v" << report.version << " is desired on every node"
                << (report.already_desired ? " (already)" : "") << " (revision " << m.revision
                << ") at " << control.connected_server() << "\n";
      return exit_ok;
    }
    std::cerr << "cubridge: rollout of '" << m.module << "' v" << report.version
              << " halted: " << report.halt_reason
              << " (the canaries go back to the stable version)\n";
    return exit_failure;
  }
  const auto report = control.publish(bundle, key.key);
  const auto& m = report.desired;
  std::cout << "published '" << m.module << "' v" << report.version << " (" << bundle.size()
            << " bytes): desired on every node" << (report.already_desired ? " (already)" : "")
            << " (revision " << m.revision << ") at " << control.connected_server() << "\n";
  if (!a.wait) return exit_ok;
  std::vector<std::string> targets;
  for (const auto& node : control.nodes())
    if (node.live && node.beat && node.beat->versions.contains(m.module))
      targets.push_back(node.node);
  if (targets.empty()) {
    std::cerr << "cubridge: --wait: no live node follows '" << m.module << "'\n";
    return exit_failure;
  }
  const auto results =
      control.wait_for_results(m.module, m.revision, m.stable->digest, targets, window);
  bool all_applied = results.size() == targets.size();
  for (const auto& r : results) {
    print_result(r);
    all_applied =
        all_applied && (r.outcome == gate_outcome::applied || r.outcome == gate_outcome::duplicate);
  }
  if (results.size() < targets.size())
    std::cerr << "cubridge: " << targets.size() - results.size() << " of " << targets.size()
              << " node(s) gave no result within " << a.window_s << " s\n";
  return all_applied ? exit_ok : exit_failure;
}

int fleet_commands::rollback() const {
  const auto& a = rollback_args_;
  if (const auto problem = fleet::check_fleet_name(a.module, "module name"); !problem.empty())
    throw usage_error(problem);
  auto o = options(a.key, a.allow_readable_key);
  const auto key = read_signing_key(a.key, a.allow_readable_key);
  controller control(std::move(o));
  const auto written = control.rollback(a.module, a.to_version, key.key);
  std::cout << "'" << a.module << "' v" << written.stable->version
            << " is desired again on every node (" << written.reason << ", revision "
            << written.revision << ") at " << control.connected_server() << "\n";
  return exit_ok;
}

int fleet_commands::resume_or_abort(bool resume) const {
  const auto& a = rollback_args_;
  if (const auto problem = fleet::check_fleet_name(a.module, "module name"); !problem.empty())
    throw usage_error(problem);
  auto o = options(a.key, a.allow_readable_key);
  const auto key = read_signing_key(a.key, a.allow_readable_key);
  controller control(std::move(o));
  if (resume) return wave_outcome(control.resume(a.module, key.key));
  const auto written = control.abort(a.module, key.key);
  std::cout << "'" << a.module << "': " << written.reason << "; every node runs "
            << (written.stable ? "v" + std::to_string(written.stable->version) : "no version")
            << " (revision " << written.revision << ")\n";
  return exit_ok;
}

int fleet_commands::wave_outcome(const fleet::rollout_report& report) const {
  const auto& m = report.desired;
  for (const auto& e : report.timeline) {  // the time of day, and since the first step
    const std::chrono::duration<double> since = e.time - report.timeline.front().time;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(e.time.time_since_epoch()).count() %
        1000;
    const auto day =
        cubridge::detail::format_time(std::chrono::floor<std::chrono::seconds>(e.time));
    char at[64];
    std::snprintf(at, sizeof at, "%s.%03dZ (+%7.3f s)", day.substr(0, day.size() - 1).c_str(),
                  static_cast<int>(ms), since.count());
    std::cout << at << "  wave " << e.wave + 1 << "  " << to_string(e.what) << "  " << e.detail
              << "\n";
  }
  if (report.completed) {
    std::cout << "'" << m.module << "' v" << report.version << " is desired on every node"
              << (report.already_desired ? " (already)" : "") << " (revision " << m.revision
              << ")\n";
    return exit_ok;
  }
  std::cerr << "cubridge: wave rollout of '" << m.module << "' v" << report.version << " halted ("
            << fleet::signal_text(report.halt_signal, report.halt_metric)
            << (report.halt_node.empty() ? "" : ", node " + report.halt_node)
            << "): " << report.halt_reason
            << "; its nodes go back to the stable version (`cubridge fleet resume " << m.module
            << "` runs the wave again, `cubridge fleet abort " << m.module << "` ends it)\n";
  return exit_failure;
}

int fleet_commands::dashboard() const {
  dashboard_options d;
  const auto colon = dashboard_listen_.rfind(':');
  const auto port =
      colon == std::string::npos ? std::string() : dashboard_listen_.substr(colon + 1);
  int value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (colon == std::string::npos || colon == 0 || port.empty() || ec != std::errc{} ||
      end != port.data() + port.size() || value < 1 || value > 65535)
    throw usage_error("--listen '" + printable(dashboard_listen_) +
                      "' is not HOST:PORT (e.g. 127.0.0.1:8090)");
  d.host = dashboard_listen_.substr(0, colon);
  if (d.host.size() > 2 && d.host.front() == '[' && d.host.back() == ']')
    d.host = d.host.substr(1, d.host.size() - 2);
  d.port = value;
  const auto o = options(status_key_, true);
  return serve_dashboard([&o] { return std::make_unique<controller>(o); }, d);
}

int fleet_commands::enroll() const {
  const auto& a = enroll_args_;
  if (const auto problem = fleet::check_fleet_name(a.node, "node id"); !problem.empty())
    throw usage_error(problem);
  std::map<std::string, std::string, std::less<>> labels;
  for (const auto& label : a.labels) {
    const auto eq = label.find('=');
    if (eq == std::string::npos)
      throw usage_error("--label '" + printable(label) + "' is not NAME=VALUE");
    labels[label.substr(0, eq)] = label.substr(eq + 1);
  }
  auto o = options(a.key, a.allow_readable_key);
  const auto key = read_signing_key(a.key, a.allow_readable_key);
  const auto node_key = read_public_key_file(a.node_key);
  controller control(std::move(o));
  control.enroll(a.node, node_key, labels, key.key);
  std::cout << "enrolled node '" << a.node << "' (key " << to_hex(node_key.id()) << ") at "
            << control.connected_server() << "\n";
  return exit_ok;
}

}  // namespace cubridge::tool
