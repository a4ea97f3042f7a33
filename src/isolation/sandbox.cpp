// The sandbox's public face: starting (the worker's environment chosen here), calling, sharing,
// restarting, the accessors, the error and its names. The worker process is
// sandbox_worker_process.cpp, the workers and spares sandbox_pool.cpp, the calls sandbox_call.cpp.
#include "sandbox_state.hpp"

#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/installation.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <system_error>

namespace cubridge {

std::string_view to_string(sandbox_failure reason) noexcept {
  static constexpr std::array<detail::enum_name<sandbox_failure>, 9> names{{
      {sandbox_failure::crashed, "crashed"},
      {sandbox_failure::aborted, "aborted"},
      {sandbox_failure::timed_out, "timed_out"},
      {sandbox_failure::cuda_fault, "cuda_fault"},
      {sandbox_failure::protocol, "protocol"},
      {sandbox_failure::start_failed, "start_failed"},
      {sandbox_failure::no_such_entry, "no_such_entry"},
      {sandbox_failure::buffer_import_failed, "buffer_import_failed"},
      {sandbox_failure::device_reset, "device_reset"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, reason, "unknown");
}

std::string_view to_string(sandbox_recovery recovery) noexcept {
  static constexpr std::array<detail::enum_name<sandbox_recovery>, 3> names{{
      {sandbox_recovery::none, "none"},
      {sandbox_recovery::spare_promoted, "spare_promoted"},
      {sandbox_recovery::restarted, "restarted"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, recovery, "unknown");
}

namespace {

std::string recovery_text(sandbox_recovery recovery, std::chrono::nanoseconds duration) {
  const auto ms = std::to_string(std::chrono::duration<double, std::milli>(duration).count());
  switch (recovery) {
    case sandbox_recovery::spare_promoted:
      return "; a standby worker took over in " + ms + " ms";
    case sandbox_recovery::restarted:
      return "; worker restarted in " + ms + " ms";
    case sandbox_recovery::none:
      break;
  }
  return "";
}

bool is_executable(const std::filesystem::path& p) {
  return !p.empty() && ::access(p.c_str(), X_OK) == 0 && !std::filesystem::is_directory(p);
}

}  // namespace

sandbox_error::sandbox_error(sandbox_failure reason, std::string call, std::string detail,
                             sandbox_recovery recovery, std::chrono::nanoseconds restart_duration,
                             std::chrono::steady_clock::time_point seen_at,
                             std::optional<sandbox_fault_report> fault, std::source_location where)
    : error(isolation_error_domain, static_cast<int>(isolation_errc::sandbox_failure),
            "sandbox " + std::string(cubridge::to_string(reason)), std::move(call),
            std::move(detail) + recovery_text(recovery, restart_duration), where),
      reason_(reason),
      recovery_(recovery),
      restart_duration_(restart_duration),
      seen_at_(seen_at),
      fault_(fault) {}

sandbox_error::sandbox_error(sandbox_failure reason, std::string call, std::string detail,
                             bool restarted, std::chrono::nanoseconds restart_duration,
                             std::source_location where)
    : sandbox_error(reason, std::move(call), std::move(detail),
                    restarted ? sandbox_recovery::restarted : sandbox_recovery::none,
                    restart_duration, std::chrono::steady_clock::now(), std::nullopt, where) {}

namespace {

/// The worker's environment (sandbox_environment): the host's now, without LD_PRELOAD unless
/// kept, the variables set, and the reset guard first in LD_PRELOAD if asked for.
std::vector<std::string> worker_environment(const sandbox_environment& env,
                                            const std::filesystem::path& guard) {
  for (const auto& v : env.variables)
    CUBRIDGE_EXPECTS(v.find('=') != std::string::npos && v.front() != '=',
                     "sandbox environment entry '" + v + "' is not NAME=value");
  std::vector<std::string> removed;
  if (!env.inherit_preload) removed.emplace_back("LD_PRELOAD");
  auto result = detail::environment_with(env.variables, removed);
  if (!env.reset_guard) return result;
  const std::string prefix = "LD_PRELOAD=";
  for (auto& entry : result)
    if (entry.starts_with(prefix)) {
      const auto rest = entry.substr(prefix.size());
      entry = prefix + guard.string() + (rest.empty() ? "" : " " + rest);
      return result;
    }
  result.push_back(prefix + guard.string());
  return result;
}

}  // namespace

// --- sandbox ------------------------------------------------------------------------------------

std::filesystem::path sandbox::default_worker() {
  return locate(helper_file::sandbox_worker).path;
}

std::filesystem::path sandbox::default_reset_guard() {
  return locate(helper_file::reset_guard).path;
}

sandbox sandbox::start(sandbox_options options) {
  auto s = std::make_shared<state>(std::move(options));
  s->name = s->options.name.empty() ? s->options.library.filename().string() : s->options.name;
  s->worker_path = s->options.worker.empty() ? default_worker() : s->options.worker;
  const std::string call = "sandbox::start";
  CUBRIDGE_EXPECTS(s->options.workers >= 1,
                   "sandbox '" + s->name + "' needs at least one worker (workers = 0)");
  CUBRIDGE_EXPECTS(s->options.workers <= sandbox_options::max_workers &&
                       s->options.standby <= sandbox_options::max_standby,
                   "sandbox '" + s->name + "' asks for " + std::to_string(s->options.workers) +
                       " workers and " + std::to_string(s->options.standby) + " spares; at most " +
                       std::to_string(sandbox_options::max_workers) + " and " +
                       std::to_string(sandbox_options::max_standby) +
                       " (each is a process with a CUDA context)");
  if (s->options.initialize_cuda)
    enforce_mps_policy(s->options.mps, s->options.device, "sandbox '" + s->name + "'");
  if (!is_executable(s->worker_path))
    throw sandbox_error(sandbox_failure::start_failed, call,
                        "sandbox '" + s->name + "': worker " + s->worker_path.string() +
                            " is not an executable file (set sandbox_options::worker or "
                            "CUBRIDGE_SANDBOX_WORKER)",
                        false, {});
  // A bare name ("libvendor.so") is the worker's dlopen's to find, on its search path, as a
  // program linking the library would; a path must exist.
  const bool bare_name = s->options.library.string().find('/') == std::string::npos;
  if (!bare_name && !std::filesystem::exists(s->options.library))
    throw sandbox_error(
        sandbox_failure::start_failed, call,
        "sandbox '" + s->name + "': library " + s->options.library.string() + " does not exist",
        false, {});
  const auto& env = s->options.environment;
  const auto guard =
      env.reset_guard_library.empty() ? default_reset_guard() : env.reset_guard_library;
  if (env.reset_guard && !std::filesystem::exists(guard))
    throw sandbox_error(sandbox_failure::start_failed, call,
                        "sandbox '" + s->name + "': reset guard " + guard.string() +
                            " does not exist (set sandbox_environment::reset_guard_library or "
                            "CUBRIDGE_RESET_GUARD)",
                        false, {});
  s->worker_environment = worker_environment(env, guard);
  s->start_pool();
  return sandbox(std::move(s));
}

sandbox::sandbox(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}
sandbox::sandbox(sandbox&&) noexcept = default;
sandbox& sandbox::operator=(sandbox&& other) noexcept {
  if (this != &other) {
    if (state_) state_->shutdown();
    state_ = std::move(other.state_);
  }
  return *this;
}

sandbox::~sandbox() {
  if (state_) state_->shutdown();
}

sandbox_reply sandbox::call(std::string_view entry, const sandbox_request& request) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "calling a moved-from sandbox");
  // A caller's mistake, refused here: the worker would refuse it too, and be replaced for it.
  namespace protocol = detail::sandbox_protocol;
  CUBRIDGE_EXPECTS(request.reply_capacity <= protocol::max_reply_capacity,
                   "sandbox '" + state_->name + "': call '" + std::string(entry) +
                       "' asks room for a reply of " + std::to_string(request.reply_capacity) +
                       " bytes; at most " + std::to_string(protocol::max_reply_capacity));
  CUBRIDGE_EXPECTS(entry.size() + request.bytes.size() <= protocol::max_request_bytes,
                   "sandbox '" + state_->name + "': call '" + std::string(entry.substr(0, 64)) +
                       "' sends " + std::to_string(entry.size() + request.bytes.size()) +
                       " bytes of entry name and request; at most " +
                       std::to_string(protocol::max_request_bytes));
  for (const sandbox_share& share : request.buffers)
    CUBRIDGE_EXPECTS(share.state_ == state_, "buffer " + detail::hex(share.host_address()) +
                                                 " passed to sandbox '" + state_->name +
                                                 "' is not shared with it (share it with this "
                                                 "sandbox's share())");
  return state_->call(entry, request);
}

sandbox_share sandbox::share(const shared_device_memory& memory) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "sharing with a moved-from sandbox");
  auto buffer = std::make_shared<sandbox_internal::shared_buffer>();
  buffer->fd = memory.export_fd();
  buffer->size = memory.size_bytes();
  buffer->host_address = memory.address();
  buffer->device = memory.device().ordinal();
  std::unique_lock lock(state_->mutex);
  const std::uint64_t id = state_->next_share_id++;
  state_->shares.emplace(id, std::move(buffer));
  state_->map_ahead(id, lock);
  return sandbox_share(state_, id, memory.address(), memory.size_bytes());
}

void sandbox::restart() {
  CUBRIDGE_EXPECTS(state_ != nullptr, "restarting a moved-from sandbox");
  if (auto [failure, took] = state_->restart_all(); !failure.empty())
    throw sandbox_error(sandbox_failure::start_failed, "sandbox::restart",
                        "sandbox '" + state_->name + "': " + failure, false, took);
}

bool sandbox::wait_for_standby(std::chrono::milliseconds timeout) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "waiting on a moved-from sandbox");
  return state_->wait_for_standby(timeout);
}

pid_t sandbox::worker_pid() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  const auto& slots = state_->slots;
  return !slots.empty() && slots.front().w ? slots.front().w->process.pid() : 0;
}

std::size_t sandbox::restarts() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->counters.failovers + state_->counters.restarts;
}

std::chrono::nanoseconds sandbox::last_start_duration() const noexcept {
  if (!state_) return {};
  std::lock_guard lock(state_->mutex);
  return state_->last_start;
}

std::string sandbox::worker_cuda_status() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "reading a moved-from sandbox");
  std::lock_guard lock(state_->mutex);
  return state_->cuda_status;
}

const std::string& sandbox::name() const noexcept {
  return state_->name;
}

sandbox_stats sandbox::stats() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "reading a moved-from sandbox");
  return state_->stats();
}

// --- sandbox_share ------------------------------------------------------------------------------

sandbox_share::sandbox_share(sandbox_share&& o) noexcept
    : state_(std::move(o.state_)),
      id_(std::exchange(o.id_, 0)),
      host_address_(std::exchange(o.host_address_, 0)),
      size_(std::exchange(o.size_, 0)) {}

sandbox_share& sandbox_share::operator=(sandbox_share&& o) noexcept {
  if (this != &o) {
    reset();
    state_ = std::move(o.state_);
    id_ = std::exchange(o.id_, 0);
    host_address_ = std::exchange(o.host_address_, 0);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

sandbox_share::~sandbox_share() {
  reset();
}

void sandbox_share::reset() noexcept {
  if (state_) state_->unshare(id_);
  state_.reset();
  id_ = 0;
}

}  // namespace cubridge
