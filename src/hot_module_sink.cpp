// A module_sink over hot_module; see hot_module_sink.hpp.
#include <cubridge/hot_module_sink.hpp>

#include <unordered_map>

namespace cubridge {

struct hot_module_sink::entry {
  hot_module* module = nullptr;
  stage_options stage;
  mutable std::mutex mutex;  // the fields below; apply/rollback are serialised by the endpoint
  std::uint64_t current = 0;
  std::uint64_t previous = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> bundle_version_of;  // hot_module id -> version
  std::string last_error;
};

hot_module_sink::hot_module_sink(compile_options compile) : compile_(std::move(compile)) {}
hot_module_sink::~hot_module_sink() = default;

void hot_module_sink::add(hot_module& module, std::uint64_t version, stage_options stage) {
  const int sm = module.context().device().capability().as_int();
  std::lock_guard lock(mutex_);
  CUBRIDGE_EXPECTS(!modules_.contains(module.name()),
                   "module '" + module.name() + "' added to the sink twice");
  CUBRIDGE_EXPECTS(sm_ == 0 || sm_ == sm, "module '" + module.name() + "' is on an sm_" +
                                              std::to_string(sm) + " device, the others on sm_" +
                                              std::to_string(sm_));
  sm_ = sm;
  auto e = std::make_unique<entry>();
  e->module = &module;
  e->stage = std::move(stage);
  if (e->stage.source_name.empty()) e->stage.source_name = module.name();
  e->current = version;
  e->bundle_version_of[module.stats().current_version] = version;
  modules_.emplace(module.name(), std::move(e));
}

hot_module_sink::entry* hot_module_sink::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  const auto it = modules_.find(name);
  return it == modules_.end() ? nullptr : it->second.get();
}

int hot_module_sink::device_sm() const {
  std::lock_guard lock(mutex_);
  return sm_;
}

std::uint64_t hot_module_sink::current_version(std::string_view name) const {
  const entry* e = find(name);
  if (!e) return 0;
  std::lock_guard lock(e->mutex);
  return e->current;
}

sink_result hot_module_sink::apply(const verified_bundle& bundle) {
  const auto& m = bundle.manifest;
  entry* e = find(m.name);
  if (!e) return {sink_outcome::unknown_module, 0, "no hot module '" + m.name + "' in this service"};
  const std::uint64_t before = current_version(m.name);
  auto refuse = [&](sink_outcome outcome, std::string why) {
    std::lock_guard lock(e->mutex);
    e->last_error = "v" + std::to_string(m.version) + ": " + why;
    return sink_result{outcome, before, std::move(why)};
  };
  try {
    std::vector<std::byte> compiled;
    std::span<const std::byte> image = bundle.payload;
    if (m.kind == payload_kind::cuda_source) {
      // For exactly this device: the driver gets machine code, never PTX to JIT.
      auto options = compile_;
      options.architecture = "sm_" + std::to_string(device_sm());
      const cuda_source source{m.name + ".cu",
                               std::string(reinterpret_cast<const char*>(bundle.payload.data()),
                                           bundle.payload.size())};
      compiled = nvrtc_compile(source, options).cubin;
      image = compiled;
    }
    auto options = e->stage;
    options.source_name = e->stage.source_name + " v" + std::to_string(m.version);
    auto staged = e->module->stage(image, options);
    const std::uint64_t id = e->module->promote(std::move(staged));
    std::lock_guard lock(e->mutex);
    e->bundle_version_of[id] = m.version;
    e->previous = e->current;
    e->current = m.version;
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
  std::lock_guard lock(e->mutex);
  if (e->previous == 0)
    return {sink_outcome::no_previous_version, e->current,
            "module '" + std::string(name) + "' has no version to roll back to"};
  try {
    const std::uint64_t id = e->module->rollback();
    const auto it = e->bundle_version_of.find(id);
    std::swap(e->current, e->previous);
    if (it != e->bundle_version_of.end()) e->current = it->second;
    return {sink_outcome::done, e->current, {}};
  } catch (const std::exception& x) {
    e->last_error = std::string("rollback: ") + x.what();
    return {sink_outcome::failed, e->current, x.what()};
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
    const auto stats = e->module->stats();
    std::lock_guard lock(e->mutex);
    module_report r{name, e->current, {}, stats.retired_waiting, e->last_error};
    if (e->previous) r.versions_held.push_back(e->previous);
    if (e->current) r.versions_held.push_back(e->current);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace cubridge
