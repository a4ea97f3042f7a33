// A module_sink over hot_module; see hot_module_sink.hpp.
#include <cubridge/core/log.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/swap/probation.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include <algorithm>

namespace cubridge {

// No versions here: the module's chain (swap_target::versions()) is the one record of them,
// its labels the bundle versions and its signers the keys' ids. An entry serves one hot module
// or one group of them (every device at once) through their one face, holding a handle of it:
// it cannot outlive it.
struct hot_module_sink::entry {
  std::unique_ptr<swap_target> target;
  stage_options stage;
  mutable std::mutex mutex;  // last_error; apply/rollback are serialised by the gate
  std::string last_error;
};

namespace {
module_counters counters_of(const swap_counters& c) {
  return {.promotions = c.promotions,
          .rollbacks = c.rollbacks,
          .rejected = c.rejected,
          .unloaded = c.unloaded,
          .reclaim_failures = c.reclaim_failures,
          .launches = c.launches,
          .launch_failures = c.launch_failures,
          .last_launch_failure = c.last_launch_failure,
          .sticky_error = c.sticky_error};
}
}  // namespace

hot_module_sink::hot_module_sink(compile_options compile) : compile_(std::move(compile)) {}
hot_module_sink::~hot_module_sink() = default;

source_kind source_kind_of(payload_kind kind) noexcept {
  switch (kind) {
    case payload_kind::cubin:
      return source_kind::cubin;
    case payload_kind::fatbin:
      return source_kind::fatbin;
    case payload_kind::cuda_source:
      break;
  }
  return source_kind::cuda_source;
}

void hot_module_sink::add(hot_module module, stage_options stage) {
  const std::vector<context_ref> contexts{module.context()};
  add_entry(std::make_unique<hot_module>(std::move(module)), std::move(stage), contexts);
}

void hot_module_sink::add(hot_module_group group, stage_options stage) {
  const auto device = group.member(0).context().device().capability();
  for (std::size_t i = 1; i < group.size(); ++i) {
    const auto other = group.member(i).context().device().capability();
    CUBRIDGE_EXPECTS(other == device, "group '" + group.name() + "': member " + std::to_string(i) +
                                          " is on an " + to_string(other) +
                                          " device, member 0 on an " + to_string(device) +
                                          "; a sink loads one bundle for every member");
  }
  std::vector<context_ref> contexts;
  for (std::size_t i = 0; i < group.size(); ++i) contexts.push_back(group.member(i).context());
  add_entry(std::make_unique<hot_module_group>(std::move(group)), std::move(stage), contexts);
}

void hot_module_sink::add_entry(std::unique_ptr<swap_target> target, stage_options stage,
                                const std::vector<context_ref>& contexts) {
  const auto name = target->name();
  const auto device = target->device_capability();
  std::lock_guard lock(mutex_);
  CUBRIDGE_EXPECTS(!modules_.contains(name), "module '" + name + "' added to the sink twice");
  CUBRIDGE_EXPECTS(!device_ || *device_ == device,
                   "module '" + name + "' is on an " + to_string(device) +
                       " device, the others on " + to_string(device_.value_or(device)));
  device_ = device;
  // Versions that arrive over the network are smoke-tested out of the serving process: with a
  // probation policy its replays are the smoke test, in the worker, and an in-process test is
  // not run for them; without one, an in-process test is the caller's explicit choice, said once.
  if (stage.probation && stage.smoke_test) {
    stage.smoke_test = nullptr;
    log::info("module '" + name +
              "': versions from the network are smoke-tested in the "
              "probation worker (its replays), not by the in-process smoke test given");
  } else if (stage.smoke_test) {
    log::warn("module '" + name +
              "': its smoke test runs in the serving process for versions "
              "from the network; a candidate that faults there poisons it (a probation policy's "
              "replays run it in a sandbox worker: docs/hot-swap.md, 'Probation')");
  }
  auto e = std::make_unique<entry>();
  e->target = std::move(target);
  e->stage = std::move(stage);
  if (e->stage.source_name.empty()) e->stage.source_name = name;
  modules_.emplace(name, std::move(e));
  for (const auto ctx : contexts)
    if (std::find(contexts_.begin(), contexts_.end(), ctx) == contexts_.end())
      contexts_.push_back(ctx);
}

hot_module_sink::entry* hot_module_sink::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  const auto it = modules_.find(name);
  return it == modules_.end() ? nullptr : it->second.get();
}

std::optional<compute_capability> hot_module_sink::device_capability() const {
  std::lock_guard lock(mutex_);
  return device_;
}

std::uint64_t hot_module_sink::current_version(std::string_view name) const {
  const entry* e = find(name);
  if (!e) return 0;
  return e->target->versions().serving.origin.label;
}

namespace {

// The gate's word for a probation that refused a version (swap/probation.hpp).
gate_reason reason_of(probation_verdict verdict) noexcept {
  switch (verdict) {
    case probation_verdict::faulted:
      return gate_reason::faulted_in_probation;
    case probation_verdict::mismatch:
      return gate_reason::mismatch_in_probation;
    case probation_verdict::incomplete:
      return gate_reason::probation_incomplete;
    case probation_verdict::passed:
      break;
  }
  return gate_reason::stage_refused;
}

}  // namespace

sink_result hot_module_sink::apply(const verified_bundle& bundle, apply_rule rule) {
  const auto& m = bundle.manifest;
  entry* e = find(m.name);
  if (!e) return {gate_reason::unknown_module, 0, "no hot module '" + m.name + "' in this service"};
  auto refuse = [&](gate_reason reason, std::string why) {
    const std::uint64_t serving = current_version(m.name);
    std::lock_guard lock(e->mutex);
    e->last_error = "v" + std::to_string(m.version) + ": " + why;
    return sink_result{reason, serving, std::move(why)};
  };
  try {
    std::vector<std::byte> compiled;
    std::span<const std::byte> image = bundle.payload;
    if (m.kind == payload_kind::cuda_source) {
      // For exactly this device: the driver gets machine code, never PTX to JIT.
      compiled = build_machine_code(source_kind_of(m.kind), bundle.payload, m.name + ".cu",
                                    device_capability().value(), {compile_});
      image = compiled;
    }
    auto options = e->stage;
    options.source_name = e->stage.source_name + " v" + std::to_string(m.version);
    options.label = m.version;
    options.signer = to_hex(m.key_id);
    // Machine code as verify_bundle inspected it (not parsed again); compiled code afresh.
    const auto applied = e->target->stage_and_promote(
        image, bundle.image && compiled.empty() ? &*bundle.image : nullptr, options,
        rule == apply_rule::above_serving ? promote_condition::label_above_serving
                                          : promote_condition::always);
    if (applied.outcome == apply_outcome::not_newer) {
      auto refused = not_newer_result(m.name, m.version, applied.serving_label);
      std::lock_guard lock(e->mutex);
      e->last_error = refused.detail;
      return refused;
    }
    std::lock_guard lock(e->mutex);
    e->last_error.clear();
    return {gate_reason::none, applied.serving_label, {}};
  } catch (const compile_error& x) {
    return refuse(gate_reason::stage_refused, x.what());
  } catch (const probation_error& x) {
    return refuse(reason_of(x.result().verdict), x.what());
  } catch (const version_rejected_error& x) {
    return refuse(gate_reason::stage_refused, x.what());
  } catch (const image_error& x) {
    return refuse(gate_reason::stage_refused, x.what());
  } catch (const std::exception& x) {
    return refuse(gate_reason::apply_failed, x.what());
  }
}

sink_result hot_module_sink::rollback(std::string_view name) {
  entry* e = find(name);
  if (!e) return {gate_reason::unknown_module, 0, "no hot module '" + std::string(name) + "'"};
  std::uint64_t serving = 0;
  try {
    const auto held = e->target->versions();
    serving = held.serving.origin.label;
    if (!held.rollback_target)
      return {gate_reason::no_previous_version, serving,
              "module '" + std::string(name) + "' has no version to roll back to"};
    // To whatever the chain holds now (another promoter may have switched since versions()).
    (void)e->target->rollback();
    return {gate_reason::none, current_version(name), {}};
  } catch (const std::exception& x) {
    std::lock_guard lock(e->mutex);
    e->last_error = std::string("rollback: ") + x.what();
    return {gate_reason::apply_failed, serving, x.what()};
  }
}

std::vector<module_report> hot_module_sink::status() const {
  std::vector<std::pair<std::string, entry*>> all;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, e] : modules_) all.emplace_back(name, e.get());
  }
  std::vector<module_report> out;
  for (const auto& [name, e] : all) {
    const auto held = e->target->versions();
    module_report r{name, held.serving.origin.label, {}, held.retired.size(), {}};
    if (held.rollback_target) r.versions_held.push_back(held.rollback_target->origin.label);
    r.versions_held.push_back(held.serving.origin.label);
    r.counters = counters_of(e->target->counters());
    std::lock_guard lock(e->mutex);
    r.last_error = e->last_error;
    out.push_back(std::move(r));
  }
  return out;
}

bool hot_module_sink::probe_health() const noexcept {
  if (process_poisoned()) return true;
  try {
    // A copy, so that mutex_ is not held in the driver calls: a poison listener (the fleet
    // agent's last heartbeat) may ask status(), which takes it.
    std::vector<context_ref> contexts;
    {
      std::lock_guard lock(mutex_);
      contexts = contexts_;
    }
    for (const auto ctx : contexts)
      if (probe_process_health(ctx)) return true;
  } catch (...) {
    // No memory for the copy: the flag alone answers.
  }
  return process_poisoned();
}

}  // namespace cubridge
