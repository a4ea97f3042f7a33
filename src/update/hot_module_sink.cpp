// A module_sink over hot_module; see hot_module_sink.hpp.
#include <cubridge/update/hot_module_sink.hpp>

namespace cubridge {

// No versions here: the module's chain (hot_module::versions()) is the one record of them.
struct hot_module_sink::entry {
  hot_module* module = nullptr;
  stage_options stage;
  mutable std::mutex mutex;  // last_error; apply/rollback are serialised by the endpoint
  std::string last_error;
};

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

void hot_module_sink::add(hot_module& module, stage_options stage) {
  const auto device = module.context().device().capability();
  std::lock_guard lock(mutex_);
  CUBRIDGE_EXPECTS(!modules_.contains(module.name()),
                   "module '" + module.name() + "' added to the sink twice");
  CUBRIDGE_EXPECTS(!device_ || *device_ == device,
                   "module '" + module.name() + "' is on an " + to_string(device) +
                       " device, the others on " + to_string(device_.value_or(device)));
  device_ = device;
  auto e = std::make_unique<entry>();
  e->module = &module;
  e->stage = std::move(stage);
  if (e->stage.source_name.empty()) e->stage.source_name = module.name();
  modules_.emplace(module.name(), std::move(e));
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
  return e->module->versions().serving.origin.bundle_version;
}

sink_result hot_module_sink::apply(const verified_bundle& bundle) {
  const auto& m = bundle.manifest;
  entry* e = find(m.name);
  if (!e)
    return {sink_outcome::unknown_module, 0, "no hot module '" + m.name + "' in this service"};
  auto refuse = [&](sink_outcome outcome, std::string why) {
    const std::uint64_t serving = current_version(m.name);
    std::lock_guard lock(e->mutex);
    e->last_error = "v" + std::to_string(m.version) + ": " + why;
    return sink_result{outcome, serving, std::move(why)};
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
    options.bundle_version = m.version;
    options.key_id = to_hex(m.key_id);
    // Machine code as verify_bundle inspected it (not parsed again); compiled code afresh.
    (void)e->module->promote(bundle.image && compiled.empty()
                                 ? e->module->stage(image, *bundle.image, options)
                                 : e->module->stage(image, options));
    std::lock_guard lock(e->mutex);
    e->last_error.clear();
    return {sink_outcome::done, m.version, {}};
  } catch (const compile_error& x) {
    return refuse(sink_outcome::rejected, x.what());
  } catch (const version_rejected_error& x) {
    return refuse(sink_outcome::rejected, x.what());
  } catch (const image_error& x) {
    return refuse(sink_outcome::rejected, x.what());
  } catch (const std::exception& x) {
    return refuse(sink_outcome::failed, x.what());
  }
}

sink_result hot_module_sink::rollback(std::string_view name) {
  entry* e = find(name);
  if (!e) return {sink_outcome::unknown_module, 0, "no hot module '" + std::string(name) + "'"};
  std::uint64_t serving = 0;
  try {
    const auto held = e->module->versions();
    serving = held.serving.origin.bundle_version;
    if (!held.rollback_target)
      return {sink_outcome::no_previous_version, serving,
              "module '" + std::string(name) + "' has no version to roll back to"};
    // To whatever the chain holds now (another promoter may have switched since versions()).
    (void)e->module->rollback();
    return {sink_outcome::done, current_version(name), {}};
  } catch (const std::exception& x) {
    std::lock_guard lock(e->mutex);
    e->last_error = std::string("rollback: ") + x.what();
    return {sink_outcome::failed, serving, x.what()};
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
    const auto held = e->module->versions();
    module_report r{name, held.serving.origin.bundle_version, {}, held.retired.size(), {}};
    if (held.rollback_target)
      r.versions_held.push_back(held.rollback_target->origin.bundle_version);
    r.versions_held.push_back(held.serving.origin.bundle_version);
    const auto stats = e->module->stats();
    r.counters = module_counters{stats.promotions, stats.rollbacks, stats.rejected, stats.unloaded,
                                 stats.reclaim_failures};
    std::lock_guard lock(e->mutex);
    r.last_error = e->last_error;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace cubridge
