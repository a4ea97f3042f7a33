// `cubridge fleet publish` and `cubridge fleet rollback`, and the registration of the fleet
// commands (status and watch: fleet_status.cpp). Bundles are made as `cubridge push` makes them
// (tools/update/signing.hpp): a .bundle as is, a .cu compiled for the fleet's GPU, a cubin or
// fatbin signed.
#include "fleet/fleet_commands.hpp"

#include "exit_codes.hpp"
#include "fleet/fleet_status.hpp"
#include "update/arguments.hpp"
#include "update/signing.hpp"

#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/rollback_request.hpp>

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
    if (node.live && !node.beat.gpu.empty()) gpus.insert(node.beat.gpu);
  if (gpus.size() == 1 && parse_compute_capability(*gpus.begin())) return *gpus.begin();
  return "sm_90";
}

struct made_bundle {
  std::vector<std::byte> bytes;
  bundle_manifest manifest;
};

// The bundle to publish: a .bundle as is, else the file (compiled when .cu) signed with `key`.
made_bundle make_bundle(const controller& control, const std::filesystem::path& file,
                        signing_request request) {
  made_bundle out;
  if (file.extension() == ".bundle") {
    out.bytes = read_input(file, max_input_bytes, "bundle").bytes;
    out.manifest = peek_manifest(out.bytes);
    return out;
  }
  if (request.key.empty() || request.version == 0)
    throw usage_error("publishing " + file.string() +
                      " signs it first: give --key and --version (or publish a .bundle)");
  const auto key = read_signing_key(request.key, request.allow_readable_key);
  const auto input = read_input(file, max_input_bytes, "payload");
  if (file.extension() != ".cu") {
    out.bytes = sign_payload(request, input.bytes, false, key.key, &out.manifest);
    return out;
  }
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
  out.bytes = sign_payload(request, compiled, false, key.key, &out.manifest);
  return out;
}

void print_result(const fleet::result_record& r) {
  std::cout << "  " << r.node << " " << to_string(r.outcome) << " v" << r.version
            << (r.reason.empty() ? "" : " " + r.reason) << (r.detail.empty() ? "" : ": " + r.detail)
            << "\n";
}

std::chrono::milliseconds window_of(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

}  // namespace

fleet_commands::fleet_commands(CLI::App& app) {
  fleet_ = app.add_subcommand("fleet", "Roll modules out to a fleet over NATS JetStream");
  fleet_->require_subcommand(1);
  const auto server_option = [this](CLI::App* command) {
    command->add_option("--server", server_, "The NATS server")->capture_default_str();
  };

  auto& p = publish_args_;
  publish_ = fleet_->add_subcommand("publish", "Sign and publish a module to the fleet");
  server_option(publish_);
  publish_->add_option("file", p.file, "A .bundle (sent as is), or a .cu, cubin or fatbin")
      ->required();
  publish_->add_option("--key", p.key, "Secret key file: signs the file and any rollback");
  publish_->add_option("--name", p.name, "Module name (default: the file's stem)");
  publish_->add_option("--version", p.version, "Module version when signing")
      ->check(version_validator());
  publish_->add_option("--target", p.target,
                       "GPU to compile a .cu for (default: the nodes' common GPU, else sm_90)");
  auto* canary = publish_
                     ->add_option("--canary", p.canary,
                                  "Canaries first: the first N live "
                                  "nodes by id")
                     ->check(CLI::Range(1, 10000));
  publish_->add_option("--successes", p.successes, "Applied canary results needed (default N)")
      ->check(CLI::Range(1, 10000))
      ->needs(canary);
  publish_->add_option("--window", p.window_s, "Seconds to wait for results (default 60)")
      ->check(CLI::Range(0.001, 86400.0));
  publish_->add_option("--nodes", p.nodes, "Publish to exactly these nodes (a,b)")
      ->delimiter(',')
      ->excludes(canary);
  publish_->add_flag("--wait", p.wait, "Wait for every live node's result");
  publish_->add_flag("--allow-readable-key", p.allow_readable_key, readable_key_help);

  status_ = fleet_->add_subcommand("status", "Which node runs what, and each module's rollout");
  server_option(status_);
  status_->add_flag("--json", status_json_, "Print the status as JSON");

  rollback_ = fleet_->add_subcommand("rollback", "Roll a module back on every node (signed)");
  server_option(rollback_);
  rollback_->add_option("module", rollback_args_.module, "The module")->required();
  rollback_->add_option("--key", rollback_args_.key, "Secret key file")->required();
  rollback_
      ->add_option("--from-version", rollback_args_.from_version,
                   "The version rolled back from (default: the desired version of all)")
      ->check(version_validator());
  rollback_->add_flag("--allow-readable-key", rollback_args_.allow_readable_key, readable_key_help);

  watch_ = fleet_->add_subcommand("watch", "A live table of the nodes, until interrupted");
  server_option(watch_);
  watch_->add_flag("--once", watch_once_, "Print the table once and exit");
}

bool fleet_commands::parsed() const {
  return fleet_->parsed();
}

int fleet_commands::run() const noexcept {
  try {
    if (publish_->parsed()) return publish();
    if (status_->parsed()) return status();
    if (rollback_->parsed()) return rollback();
    if (watch_->parsed()) return watch();
  } catch (const usage_error& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_usage;
  } catch (const error& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return e.is(fleet_errc::unreachable) ? exit_unreachable : exit_failure;
  } catch (const std::exception& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_failure;
  }
  return exit_usage;
}

int fleet_commands::publish() const {
  const auto& a = publish_args_;
  if (a.canary && a.key.empty())
    throw usage_error("--canary needs --key: a halted rollout sends a signed rollback request");
  if (a.successes > a.canary)
    throw usage_error("--successes " + std::to_string(a.successes) + " is over --canary " +
                      std::to_string(a.canary));
  controller control({server_});
  const std::filesystem::path file = a.file;
  const auto bundle =
      make_bundle(control, file,
                  {file, a.key, a.name, a.version, a.target, std::nullopt, a.allow_readable_key});
  const auto& m = bundle.manifest;
  const auto window = window_of(a.window_s);
  if (a.canary) {
    const auto key = read_signing_key(a.key, a.allow_readable_key);
    const auto report =
        control.rollout(bundle.bytes, m.name, m.version, {a.canary, a.successes, window}, key.key);
    std::cout << "canaries of '" << m.name << "' v" << m.version << ":";
    for (const auto& node : report.canaries) std::cout << " " << node;
    std::cout << "\n";
    for (const auto& r : report.results) print_result(r);
    if (report.completed) {
      std::cout << "published '" << m.name << "' v" << m.version << " to all at " << server_
                << "\n";
      return exit_ok;
    }
    std::cerr << "cubridge: rollout of '" << m.name << "' v" << m.version
              << " halted: " << report.halt_reason << "\n";
    if (!report.rolled_back.empty()) {
      std::cerr << "cubridge: rollback request sent for";
      for (const auto& node : report.rolled_back) std::cerr << " " << node;
      std::cerr << "\n";
    }
    return exit_failure;
  }
  std::vector<std::string> targets = a.nodes;
  control.publish(bundle.bytes, m.name, targets);
  if (targets.empty()) {
    control.set_desired(m.name, "all", m.version);
    control.clear_halt(m.name);
  }
  std::cout << "published '" << m.name << "' v" << m.version << " (" << bundle.bytes.size()
            << " bytes) to "
            << (targets.empty() ? "all" : std::to_string(targets.size()) + " node(s)") << " at "
            << server_ << "\n";
  if (!a.wait) return exit_ok;
  if (targets.empty())
    for (const auto& node : control.nodes())
      if (node.live) targets.push_back(node.beat.node);
  const auto results = control.wait_for_results(m.name, m.version, targets, window);
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
  const auto key = read_signing_key(a.key, a.allow_readable_key);
  controller control({server_});
  std::uint64_t from = a.from_version;
  if (from == 0) from = control.desired(a.module, "all").value_or(0);
  if (from == 0) {
    std::cerr << "cubridge: no desired version of '" << a.module << "' at " << server_
              << ": give --from-version\n";
    return exit_failure;
  }
  control.rollback(a.module, sign_rollback_request(a.module, from, key.key));
  // The fleet no longer wants `from`: what it runs instead is what each node rolls back to.
  control.set_desired(a.module, "all", 0);
  control.set_desired(a.module, "canary", 0);
  std::cout << "rollback request for '" << a.module << "' from v" << from << " published at "
            << server_ << "\n";
  return exit_ok;
}

}  // namespace cubridge::tool
