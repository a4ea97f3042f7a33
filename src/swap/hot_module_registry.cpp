// The live hot modules, for process_health's poison record: which versions served when the
// process was poisoned (core/process_health.hpp, running_versions_provider).
#include "hot_module_state.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace cubridge {
namespace {

template <class State>
struct live_modules {
  std::mutex mutex;  // never held across a driver call: the provider runs inside failing ones
  std::vector<State*> states;
};

template <class State>
live_modules<State>& live() {
  // Never destroyed: a hot module with static storage may die after any function-local static.
  static auto* instance = new live_modules<State>;
  return *instance;
}

}  // namespace

void hot_module::state::register_live(state* s) {
  auto& l = live<state>();
  static std::once_flag installed;
  std::call_once(installed, [] { set_running_versions_provider(&state::running_versions); });
  std::lock_guard lock(l.mutex);
  l.states.push_back(s);
}

void hot_module::state::unregister_live(state* s) noexcept {
  auto& l = live<state>();
  std::lock_guard lock(l.mutex);
  std::erase(l.states, s);
}

std::vector<running_version> hot_module::state::running_versions() {
  auto& l = live<state>();
  std::lock_guard lock(l.mutex);
  std::vector<running_version> running;
  running.reserve(l.states.size());
  for (const auto* s : l.states) {
    running_version v;
    v.module = s->name;
    v.label = s->serving_label.load(std::memory_order_relaxed);
    v.version_id = s->serving_id.load(std::memory_order_relaxed);
    if (const auto k = s->last_kernel.load(std::memory_order_relaxed); k < s->kernel_names.size())
      v.kernel = s->kernel_names[k];
    running.push_back(std::move(v));
  }
  return running;
}

}  // namespace cubridge
