// Whether this process can still use the GPU: the first sticky error any cubridge call sees,
// kept once, and who is told (core/process_health.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <thread>
#include <utility>

namespace cubridge {
namespace {

struct health_state {
  std::atomic<bool> poisoned{false};
  std::mutex mutex;  // guards record and listeners
  std::optional<poison_record> record;
  std::vector<std::pair<std::uint64_t, std::function<void(const poison_record&)>>> listeners;
  std::uint64_t next_id = 1;
  std::atomic<running_versions_provider> provider{nullptr};
};

health_state& health() {
  // Never destroyed: a poisoned process may be noted from a destructor at exit.
  static auto* instance = new health_state;
  return *instance;
}

std::string utc_text(std::chrono::system_clock::time_point t) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  const auto n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string(text, n);
}

}  // namespace

bool is_sticky_error(CUresult result) noexcept {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
      return true;
    default:
      return false;
  }
}

std::string describe(const poison_record& r) {
  std::string text = "poisoned by " + r.error_name + " seen by " + r.call + " at " + utc_text(r.at);
  if (r.running.empty()) return text;
  text += "; serving:";
  for (const auto& v : r.running) {
    text += " " + v.module + " v" + std::to_string(v.label) + " (id " +
            std::to_string(v.version_id) + ")";
    if (!v.kernel.empty()) text += " kernel '" + v.kernel + "'";
  }
  return text;
}

std::optional<poison_record> process_health() {
  auto& h = health();
  if (!h.poisoned.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(h.mutex);
  return h.record;
}

bool process_poisoned() noexcept {
  return health().poisoned.load(std::memory_order_acquire);
}

void note_cuda_result(CUresult result, std::string_view call, std::string_view kernel) noexcept {
  if (!is_sticky_error(result)) return;
  auto& h = health();
  if (h.poisoned.load(std::memory_order_acquire)) return;
  try {
    poison_record r;
    r.error = result;
    r.error_name = detail::driver_error_name(result);
    r.call = std::string(call);
    r.at = std::chrono::system_clock::now();
    r.seen_at = std::chrono::steady_clock::now();
    if (const auto provider = h.provider.load(std::memory_order_acquire)) r.running = provider();
    if (!kernel.empty()) {
      if (r.running.empty()) r.running.emplace_back();
      r.running.front().kernel = std::string(kernel);
    }
    std::vector<std::function<void(const poison_record&)>> to_tell;
    {
      std::lock_guard lock(h.mutex);
      if (h.record) return;  // another thread was first
      h.record = r;
      h.poisoned.store(true, std::memory_order_release);
      for (const auto& [id, listener] : h.listeners) to_tell.push_back(listener);
    }
    for (const auto& listener : to_tell) listener(r);
  } catch (...) {
    // No memory for the record: the flag alone still says it.
    h.poisoned.store(true, std::memory_order_release);
  }
}

bool probe_process_health(context_ref ctx) noexcept {
  if (process_poisoned()) return true;
  if (!driver::available() || !ctx) return false;
  try {
    scoped_current current(ctx);
    const CUresult r = driver::api().cuStreamQuery(CU_STREAM_LEGACY);
    note_cuda_result(r, "health probe (cuStreamQuery)");
  } catch (...) {
    // The context could not be made current: the calls that need it will say why.
  }
  return process_poisoned();
}

std::uint64_t add_poison_listener(std::function<void(const poison_record&)> listener) {
  auto& h = health();
  std::optional<poison_record> already;
  std::uint64_t id = 0;
  {
    std::lock_guard lock(h.mutex);
    id = h.next_id++;
    if (!h.record) {
      h.listeners.emplace_back(id, std::move(listener));
      return id;
    }
    already = h.record;
  }
  listener(*already);  // poisoned before: told at once, on this thread
  return id;
}

void remove_poison_listener(std::uint64_t id) noexcept {
  auto& h = health();
  std::lock_guard lock(h.mutex);
  std::erase_if(h.listeners, [id](const auto& entry) { return entry.first == id; });
}

void set_running_versions_provider(running_versions_provider provider) noexcept {
  health().provider.store(provider, std::memory_order_release);
}

std::uint64_t exit_when_poisoned(poison_exit_policy policy) {
  CUBRIDGE_EXPECTS(policy.grace.count() >= 0, "exit_when_poisoned: a negative grace period");
  CUBRIDGE_EXPECTS(
      policy.exit_code >= 1 && policy.exit_code <= 255,
      "exit_when_poisoned: exit code " + std::to_string(policy.exit_code) + " is outside 1..255");
  return add_poison_listener([policy](const poison_record& r) {
    // Detached: the timer outlives whatever thread saw the error, and nothing joins a process
    // that is about to end.
    std::thread([policy, text = describe(r)] {
      std::this_thread::sleep_for(policy.grace);
      std::fprintf(stderr, "cubridge: %s; exiting with %d (exit_when_poisoned)\n", text.c_str(),
                   policy.exit_code);
      std::fflush(stderr);
      std::_Exit(policy.exit_code);
    }).detach();
  });
}

namespace detail {
void reset_process_health_for_tests() noexcept {
  auto& h = health();
  std::lock_guard lock(h.mutex);
  h.record.reset();
  h.poisoned.store(false, std::memory_order_release);
}
}  // namespace detail

}  // namespace cubridge
