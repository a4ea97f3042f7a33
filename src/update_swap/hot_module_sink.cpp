// A module_sink over hot_module; see hot_module_sink.hpp.
#include <cubridge/update_swap/hot_module_sink.hpp>

namespace cubridge {

// No versions here: the module's chain (hot_module::versions()) is the one record of them,
// its labels the bundle versions and its signers the keys' ids. An entry serves one hot module
// or one group of them (every device at once), holding a handle of it: it cannot outlive it.
struct hot_module_sink::entry {
  std::optional<hot_module> module;  // one of these two
  std::optional<hot_module_group> group;
  stage_options stage;
  mutable std::mutex mutex;  // last_error; apply/rollback are serialised by the endpoint
  std::string last_error;

  [[nodiscard]] held_versions versions() const {
    return module ? module->versions() : group->versions();
  }
  /// Stages `image` (inspected already as `info`, when given) and promotes it: on every
  /// device of a group, all or nothing.
  void stage_and_promote(std::span<const std::byte> image, const image_info* info,
                         const stage_options& options) {
    if (module)
      (void)module->promote(info ? module->stage(image, *info, options)
                                 : module->stage(image, options));
    else
      (void)group->promote(info ? group->stage(image, *info, options)
                                : group->stage(image, options));
  }
  void rollback() {
    if (module)
      (void)module->rollback();
    else
      (void)group->rollback();
  }
  [[nodiscard]] module_counters counters() const {
    module_counters c;
    const auto add_launches = [&c](const launch_tally& t) {
      c.launches += t.launches;
      c.launch_failures += t.failures;
      if (!t.last_failure.empty()) c.last_launch_failure = t.last_failure;
      c.sticky_error = c.sticky_error || t.sticky;
    };
    if (module) {
      const auto stats = module->stats();
      c.promotions = stats.promotions;
      c.rollbacks = stats.rollbacks;
      c.rejected = stats.rejected;
      c.unloaded = stats.unloaded;
      c.reclaim_failures = stats.reclaim_failures;
      add_launches(module->launches());
      return c;
    }
    const auto stats = group->stats();
    c.promotions = stats.promotions;
    c.rollbacks = stats.rollbacks;
    c.rejected = stats.rejected;
    for (std::size_t i = 0; i < stats.members.size(); ++i) {
      c.unloaded += stats.members[i].unloaded;
      c.reclaim_failures += stats.members[i].reclaim_failures;
      add_launches(group->member(i).launches());
    }
    return c;
  }
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

void hot_module_sink::add(hot_module module, stage_options stage) {
  const auto name = module.name();
  const auto device = module.context().device().capability();
  auto e = std::make_unique<entry>();
  e->module = std::move(module);
  e->stage = std::move(stage);
  add_entry(name, device, std::move(e));
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
  const auto name = group.name();
  auto e = std::make_unique<entry>();
  e->group = std::move(group);
  e->stage = std::move(stage);
  add_entry(name, device, std::move(e));
}

void hot_module_sink::add_entry(const std::string& name, compute_capability device,
                                std::unique_ptr<entry> e) {
  std::lock_guard lock(mutex_);
  CUBRIDGE_EXPECTS(!modules_.contains(name), "module '" + name + "' added to the sink twice");
  CUBRIDGE_EXPECTS(!device_ || *device_ == device,
                   "module '" + name + "' is on an " + to_string(device) +
                       " device, the others on " + to_string(device_.value_or(device)));
  device_ = device;
  if (e->stage.source_name.empty()) e->stage.source_name = name;
  modules_.emplace(name, std::move(e));
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
  return e->versions().serving.origin.label;
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
    options.label = m.version;
    options.signer = to_hex(m.key_id);
    // Machine code as verify_bundle inspected it (not parsed again); compiled code afresh.
    e->stage_and_promote(image, bundle.image && compiled.empty() ? &*bundle.image : nullptr,
                         options);
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
    const auto held = e->versions();
    serving = held.serving.origin.label;
    if (!held.rollback_target)
      return {sink_outcome::no_previous_version, serving,
              "module '" + std::string(name) + "' has no version to roll back to"};
    // To whatever the chain holds now (another promoter may have switched since versions()).
    e->rollback();
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
    const auto held = e->versions();
    module_report r{name, held.serving.origin.label, {}, held.retired.size(), {}};
    if (held.rollback_target) r.versions_held.push_back(held.rollback_target->origin.label);
    r.versions_held.push_back(held.serving.origin.label);
    r.counters = e->counters();
    std::lock_guard lock(e->mutex);
    r.last_error = e->last_error;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace cubridge
